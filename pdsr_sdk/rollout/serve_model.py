"""The model names ``pdsr serve`` answers to, as vLLM's server's ``--served-model-name``: a request naming another
model is a 404 (vLLM's ``NotFoundError``), not an answer from a model the client did not ask for."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from pdsr_sdk.errors import ConfigError
from pdsr_sdk.rollout.serve_error import ServeError


def served_names(model_name: str | Sequence[str] | None, model_dir: str, *,
                 flag: str = "model_name") -> tuple[list[str], list[str]]:
    """(the names ``GET /v1/models`` lists, the first the one responses name; the names a request may also use).
    ``model_name``: one name or several (``--model-name``/``--served-model-name``, repeated); none: the model
    folder's name, and the model folder as given is taken too (vLLM's default name, which a client written for
    ``vllm serve DIR`` sends). A ConfigError naming ``flag`` for an empty or non-string name."""
    names = [model_name] if isinstance(model_name, str) else list(model_name or [])
    bad = [n for n in names if not isinstance(n, str) or not n.strip()]
    if bad:
        raise ConfigError(f"{flag}: {bad[0]!r} is not a model name; expected non-empty strings")
    if names:
        return list(dict.fromkeys(names)), []
    listed = Path(model_dir).name
    return [listed], [model_dir] if model_dir != listed else []


def check_model(body: dict[str, Any], names: Sequence[str], also: Sequence[str] = ()) -> None:
    """A 404 listing ``names`` unless a request's ``model`` is one of them or of ``also``; left out, null or empty
    it is the served model, as vLLM's server takes it."""
    model = body.get("model")
    if model is None or model == "":
        return
    if not isinstance(model, str):
        raise ServeError(400, f"model must be a string, got {model!r:.80}", param="model")
    if model not in names and model not in also:
        raise ServeError(404, f"The model `{model}` does not exist. Valid aliases: {', '.join(names)}.",
                         param="model")
