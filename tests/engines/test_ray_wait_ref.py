"""Awaiting a Ray answer (``pdsr_sdk.engines.ray_cluster.wait_ref``) without Ray: the ObjectRef stands in as
an object whose ``future()`` is a ``concurrent.futures.Future`` that another thread completes, as Ray's and Ray
Client's are. Ray Client completes it whether or not it was cancelled (Ray 2.60, util/client/common.py), and on a
cancelled one that raised InvalidStateError in its streaming thread: tracebacks at every close over ``ray://``."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

import pytest

from pdsr_sdk.engines.ray_cluster import wait_ref


class Ref:
    """An ObjectRef's stand-in: ``future()`` gives the one future its answer is set on."""

    def __init__(self):
        self.answer: Future = Future()

    def future(self) -> Future:
        return self.answer


def _answer_from_another_thread(fut: Future, result=None, error=None) -> None:
    """Set ``fut``'s answer as Ray's thread does, raising here whatever that raises there."""
    raised: list[BaseException] = []

    def run():
        try:
            fut.set_exception(error) if error is not None else fut.set_result(result)
        except BaseException as exc:  # noqa: BLE001 - carried to the test
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if raised:
        raise raised[0]


def test_an_answer_and_an_error_reach_the_awaiting_coroutine():
    async def go():
        ok, bad = Ref(), Ref()
        waits = wait_ref(ok), wait_ref(bad)
        _answer_from_another_thread(ok.answer, result={"seq": 3})
        _answer_from_another_thread(bad.answer, error=ConnectionError("actor died"))
        return await asyncio.gather(*waits, return_exceptions=True)

    result, error = asyncio.run(go())
    assert result == {"seq": 3}
    assert isinstance(error, ConnectionError) and str(error) == "actor died"


def test_cancelling_the_wait_leaves_rays_future_to_be_answered():
    """The poll that close() cancels, or a wait_for that timed out: Ray answers later, and that must not raise."""

    async def go():
        ref = Ref()
        waiting = wait_ref(ref)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.sleep(0)   # the loop runs the cancelled wait's callbacks
        assert not ref.answer.cancelled()
        _answer_from_another_thread(ref.answer, error=RuntimeError("the actor was killed"))
        await asyncio.sleep(0)   # the answer reaches the loop, which drops it
        return ref

    ref = asyncio.run(go())
    assert isinstance(ref.answer.exception(), RuntimeError)


def test_an_answer_after_the_loop_closed_is_dropped(caplog):
    ref = Ref()

    async def go():
        return wait_ref(ref)

    waiting = asyncio.run(go())   # the loop ends with the wait pending
    with caplog.at_level("ERROR", logger="concurrent.futures"):
        _answer_from_another_thread(ref.answer, result="late")
    # a callback that raised ('Event loop is closed') is logged by concurrent.futures, not raised
    assert not [r for r in caplog.records if r.name == "concurrent.futures"]
    assert not waiting.done() and ref.answer.result() == "late"
