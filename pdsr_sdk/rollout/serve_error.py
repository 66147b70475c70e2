"""The error ``pdsr serve`` answers a refused request with (:mod:`pdsr_sdk.rollout.serve_app` turns it into an
OpenAI-style error body)."""

from __future__ import annotations


class ServeError(Exception):
    """A request pdsr refuses: ``status`` is the HTTP status, the message says why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
