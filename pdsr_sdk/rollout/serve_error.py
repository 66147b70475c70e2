"""The error ``pdsr serve`` answers a refused request with, and its body (:func:`error_body`): vLLM's server's
error response, in a response and as a stream's last chunk."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

#: the body's ``type`` for a status, as vLLM's server names it (its ``create_error_response``); another status is
#: named by its phrase ("Conflict"), as vLLM names the status of an error that carries its own
VLLM_TYPES = {400: "BadRequestError", 404: "NotFoundError", 422: "UnprocessableEntityError",
              500: "InternalServerError", 501: "NotImplementedError", 503: "ServiceUnavailableError"}


class ServeError(Exception):
    """A request pdsr refuses: ``status`` is the HTTP status, the message says why; ``kind`` is the body's ``type``
    (default vLLM's for the status: :data:`VLLM_TYPES`) and ``param`` the field it names, as vLLM's server fills
    them (its 404 for a model it does not serve: ``NotFoundError``, ``model``)."""

    def __init__(self, status: int, message: str, *, kind: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.kind = kind or VLLM_TYPES.get(status) or HTTPStatus(status).phrase
        self.param = param


def error_body(exc: ServeError) -> dict[str, Any]:
    """vLLM's server's error body for ``exc`` (the ``openai`` client raises by its status: BadRequestError,
    NotFoundError, ...)."""
    return {"error": {"message": str(exc), "type": exc.kind, "param": exc.param, "code": exc.status}}


def internal_error(exc: BaseException) -> ServeError:
    """The 500 an unexpected exception (a bug) is answered with, as vLLM's server answers one: its message, not a
    plain-text 'Internal Server Error' or a stream cut off."""
    return ServeError(500, str(exc) or type(exc).__name__)
