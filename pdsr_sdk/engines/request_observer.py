"""Watching a vLLM engine's requests: the :class:`RequestObserver` a
:class:`~pdsr_sdk.engines.vllm_engine.VllmEngine` calls (its ``observer``), and :class:`PromptLog`, one that records
the prompt ids vLLM received."""

from __future__ import annotations

from typing import Any, Protocol

from pdsr_sdk.dispatch.types import SegmentRequest


class RequestObserver(Protocol):
    """Watches every request of a :class:`~pdsr_sdk.engines.vllm_engine.VllmEngine` (set as its ``observer``): a
    benchmark's recorder, a test's :class:`PromptLog`."""

    def on_launch(self, request: SegmentRequest, extra_args: dict[str, Any] | None) -> dict[str, Any] | None:
        """Called as a segment is handed to vLLM, with the extra sampling args pdsr gives it (speculative
        ``group``: the draft corpus); returns the extra args to send instead."""

    def on_output(self, request_id: str, output: Any) -> None:
        """Called with each of the request's vLLM ``RequestOutput`` as it streams (new tokens only)."""


class PromptLog:
    """A :class:`RequestObserver` that records (request id, the prompt ids vLLM received) of every request it sees,
    in :attr:`entries`: how a test checks token exactness against the engine's own view, not pdsr's records."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, list[int]]] = []
        self._logged: set[str] = set()

    def on_launch(self, request: SegmentRequest, extra_args: dict[str, Any] | None) -> dict[str, Any] | None:
        return extra_args

    def on_output(self, request_id: str, output: Any) -> None:
        ids = getattr(output, "prompt_token_ids", None)
        if ids is not None and request_id not in self._logged:   # the first output carries them
            self._logged.add(request_id)
            self.entries.append((request_id, list(ids)))
