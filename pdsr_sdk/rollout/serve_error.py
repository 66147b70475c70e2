"""The error ``pdsr serve`` answers a refused request with (:mod:`pdsr_sdk.rollout.serve_app` turns it into an
OpenAI-style error body)."""

from __future__ import annotations


class ServeError(Exception):
    """A request pdsr refuses: ``status`` is the HTTP status, the message says why; ``kind`` is the body's ``type``
    (default OpenAI's ``invalid_request_error``, ``server_error`` from 500) and ``param`` the field it names, as
    vLLM's server fills them (its 404 for a model it does not serve: ``NotFoundError``, ``model``)."""

    def __init__(self, status: int, message: str, *, kind: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")
        self.param = param
