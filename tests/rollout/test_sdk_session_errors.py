"""A session on fake engines given bad input or closed under a waiting call: a bad ``n`` or prompts is an error
naming it and the session goes on, a failed or closed session says so on every later call and starts no engine,
closing ends a step still waiting (in a thread or an asyncio task), and a hook's KeyboardInterrupt reaches the
step."""

from __future__ import annotations

import asyncio
import re

import pytest

from support import WAIT_S, raised_in_thread, requires_torch
from pdsr_sdk.errors import DataError, RunError


def fake_config(tiny_model_dir, **kw):
    """Two fake engines from the config (tests/fakes.py: responses run to max_tokens), the default policy (v3)."""
    from pdsr_sdk import RolloutConfig

    return RolloutConfig(model=str(tiny_model_dir), batch_size=2, sampling={"n": 2, "max_tokens": 8},
                         engines=[{"name": "fast-0", "pool": "fast", "backend": "fakes:LoopEngine"},
                                  {"name": "heavy-0", "pool": "heavy", "backend": "fakes:LoopEngine"}], **kw)


@requires_torch
def test_a_bad_n_is_an_error_naming_it_and_a_failed_session_says_so_on_every_later_call(tiny_model_dir):
    """``n`` is an int >= 1 (None: config.sampling.n): else a ConfigValueError naming it, and the session goes on
    (n=-1 used to fail inside v3's placement, and every later step raised the same IndexError). After a fatal
    error (here a hook that raises inside the dispatch run) every later call is a RunError saying the session
    failed, why, and to open a new one."""
    from pdsr_sdk import RolloutSession
    from pdsr_sdk.errors import ConfigValueError

    with RolloutSession(fake_config(tiny_model_dir)) as session:
        for n in (-1, 0, "2", 1.5, True):
            with pytest.raises(ConfigValueError, match=rf"n \(samples per prompt\) must be an int >= 1, or None "
                                                       rf"for config.sampling.n \(2\); got {re.escape(repr(n))}"):
                session.step(["x"], n=n)
        assert len(session.step(["x"], n=3).samples) == 3
        assert len(session.step(["x", "y"]).samples) == 4

        def boom(group):
            raise KeyError("a hook's bug")

        session.hooks.on_group_done.append(boom)
        with pytest.raises(KeyError, match="a hook's bug"):
            session.step(["x"])
        session.hooks.on_group_done.clear()
        for call in (lambda: session.step(["x"]), lambda: session.next_version()):
            with pytest.raises(RunError, match=r"the session failed earlier \(KeyError: \"a hook's bug\"\) and "
                                               r"cannot go on; close it and open a new RolloutSession") as info:
                call()
            assert isinstance(info.value.__cause__, KeyError)


@requires_torch
def test_a_closed_session_refuses_steps_and_starts_no_engine(tiny_model_dir, monkeypatch):
    """``await session.astep()`` after ``async with`` exited used to start new engines that nothing closed; the
    synchronous form said "open the session first". Both now say the session is closed, and nothing starts."""
    import pdsr_sdk.engines
    from pdsr_sdk import RolloutSession

    built = []
    build = pdsr_sdk.engines.build_engine
    monkeypatch.setattr(pdsr_sdk.engines, "build_engine", lambda *a, **k: built.append(1) or build(*a, **k))

    async def scenario():
        async with RolloutSession(fake_config(tiny_model_dir)) as session:
            await session.astep(["x"])
        assert len(built) == 2
        with pytest.raises(RunError, match=r"step: this session is closed; open a new RolloutSession"):
            await session.astep(["x"])
        with pytest.raises(RunError, match=r"start: this session is closed"):
            async with session:
                pass
        return session

    session = asyncio.run(scenario())
    assert len(built) == 2 and not session._started
    with RolloutSession(fake_config(tiny_model_dir)) as sync:
        sync.step(["x"])
    with pytest.raises(RunError, match=r"step: this session is closed"):
        sync.step(["x"])
    assert len(built) == 4


@requires_torch
def test_closing_the_session_ends_a_step_blocked_in_another_thread(tiny_model_dir):
    """A pipelined trainer's ``step(..., wait_for_update=True)`` in a worker thread, with no update coming: the
    ``with`` block's exit closes the session, and the step ends with a RunError rather than hanging the thread
    (and the script at exit) for good."""
    import threading
    import time

    from pdsr_sdk import RolloutSession

    cfg = fake_config(tiny_model_dir, policy="baseline", over_provision=1.0, max_staleness=1)
    got = {}

    def stepping(session):
        try:
            got["result"] = session.step((), wait_for_update=True)
        except BaseException as exc:  # noqa: BLE001 - what the step raised is the test's
            got["error"] = exc

    with RolloutSession(cfg) as session:
        session.step(["a", "b", "c", "d"])
        worker = threading.Thread(target=stepping, args=(session,), daemon=True)
        worker.start()
        end = time.monotonic() + WAIT_S
        while not all(g.done for g, _ in session.carried()):   # every group complete: the step holds
            assert time.monotonic() < end and worker.is_alive()
            time.sleep(0.01)
        time.sleep(0.2)
        assert worker.is_alive()
    worker.join(WAIT_S)
    assert not worker.is_alive(), "the step still waits after the session closed"
    assert isinstance(got.get("error"), RunError)
    assert "the session was closed while this call waited" in str(got["error"])


@requires_torch
@pytest.mark.parametrize("streaming", [False, True])
def test_what_a_step_takes_as_its_prompts(tiny_model_dir, streaming):
    """A bare string is one prompt (it used to be split into one prompt per character), as is a mapping; None or
    a number is a DataError saying what prompts may be (it used to be a raw TypeError), and so is a list of token
    ids given as a prompt; the session goes on after each."""
    from pdsr_sdk import RolloutSession

    cfg = fake_config(tiny_model_dir, policy="baseline", **({"over_provision": 0.0} if streaming else {}))
    with RolloutSession(cfg) as session:
        out = session.step("hello", last=streaming)
        assert [g.prompt_id for g in out.groups] == ["s0-p0"] and "hello" in out.groups[0].prompt_text
        out = session.step({"id": "m", "prompt": "hi"}, last=streaming)
        assert [g.prompt_id for g in out.groups] == ["m"]
        for bad, kind in ((None, "NoneType"), (5, "int"), (b"x", "bytes")):
            with pytest.raises(DataError, match=rf"step: prompts must be a list \(or an iterator\) of prompts, each a "
                                                rf"string, .* or a PromptRecord; got {kind}"):
                session.step(bad)
        if not streaming:
            with pytest.raises(DataError, match=r"step 2 prompts\[0\]: a list of ints looks like token ids"):
                session.step([[37, 81]])
        assert len(session.step(["a", "b"], last=streaming).groups) == 2


@requires_torch
def test_leaving_async_with_ends_a_step_task_still_waiting(tiny_model_dir):
    """The async form of the pipelined trainer: a ``wait_for_update`` step task still waiting when ``async with``
    exits ends with a RunError (close() ends every waiting call) instead of waiting on a closed session."""
    from pdsr_sdk import RolloutSession

    cfg = fake_config(tiny_model_dir, policy="baseline", over_provision=1.0, max_staleness=1)

    async def scenario():
        async with RolloutSession(cfg) as session:
            await session.astep(["a", "b", "c", "d"])
            task = asyncio.create_task(session.astep((), wait_for_update=True))
            while not all(g.done for g, _ in session.carried()):   # every group complete: the step holds
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            assert not task.done()
        done, _ = await asyncio.wait({task}, timeout=WAIT_S)
        assert done, "the step still waits after the session closed"
        with pytest.raises(RunError, match="the session was closed while this call waited"):
            task.result()

    asyncio.run(scenario())


@requires_torch
def test_a_later_partial_rollout_step_refuses_another_n_and_keeps_the_streams(tiny_model_dir):
    """Partial rollout: every group of the stream has its first step's n (carried, queued and new ones alike). A
    later ``step(n=...)`` with another size used to be ignored without a word (groups of the first step's size came
    back); it is a ConfigValueError naming n and the stream's size, and the session goes on. The same n, or none,
    is fine."""
    from pdsr_sdk import RolloutSession
    from pdsr_sdk.errors import ConfigValueError

    with RolloutSession(fake_config(tiny_model_dir, policy="baseline", over_provision=1.0)) as session:
        out = session.step(["a", "b", "c", "d"], n=3)
        with pytest.raises(ConfigValueError, match=r"step\(n=2\): partial rollout keeps one group size for its whole "
                                                   r"stream, and this stream's groups have n=3 samples"):
            session.step(["e", "f"], n=2)
        sizes = [len(g.samples) for g in out.groups]
        sizes += [len(g.samples) for g in session.step(["e", "f"], n=3).groups]
        sizes += [len(g.samples) for g in session.step((), last=True).groups]
        assert sizes == [3] * 6


@requires_torch
def test_partial_rollout_ids_are_unique_among_the_groups_in_flight(tiny_model_dir):
    """A step's groups go to a trainer with their prompt id as the group's uid, so no two groups in flight may share
    one. Dynamic sampling's top-ups in the middle of a step used to number the prompts they took from 0 again
    ('s0-p0' launched twice in step 0, one filtered, one returned); a prompt id given again while its group was
    carried used to make a second group of that id, and both came back in one step (trainer_batch's uids
    ['e', 'e', 'e', 'e', ...]: one group of four to GRPO). Ids now go on counting within a step, and an id given
    again while in flight is a DataError naming it; the session goes on."""
    from pdsr_sdk import RolloutSession

    judged = []

    def every_third(group, rewards):
        judged.append(group.prompt_id)
        return len(judged) % 3 == 0   # most groups are filtered out: the step tops up while it runs

    cfg = fake_config(tiny_model_dir, policy="baseline", over_provision=0.0)
    with RolloutSession(cfg, reward=lambda text, ground_truth=None, **_: 0.0, group_filter=every_third) as session:
        prompts = iter([f"prompt {i}" for i in range(40)])
        returned = [g.prompt_id for k in range(3) for g in session.step(prompts if k == 0 else ()).groups]
    assert len(judged) > 12 and len(set(judged)) == len(judged), judged
    assert len(returned) == 6 and set(returned) <= set(judged)

    cfg = fake_config(tiny_model_dir, policy="baseline", over_provision=1.0).model_copy(update={"batch_size": 4})
    with RolloutSession(cfg) as session:
        out = session.step([{"id": k, "prompt": k} for k in "abcde"])   # 4 returned, 'e' carried
        assert [g.prompt_id for g, _ in session.carried()] == ["e"]
        with pytest.raises(DataError, match=r"step 1 prompts: prompt id 'e' is given again while its group "
                                            r"\(launched at step 0\) is still in flight"):
            session.step([{"id": k, "prompt": k} for k in "efg"])
        out = session.step([{"id": "h", "prompt": "h"}], last=True)   # 'f' and 'g' went back to the source
        assert sorted(g.prompt_id for g in out.groups) == ["e", "f", "g", "h"] and not session.carried()


@requires_torch
def test_a_prompt_refused_at_a_top_up_fails_that_step_only(tiny_model_dir):
    """Dynamic sampling launches new groups in the middle of a step (top-ups) as groups are filtered out. A prompt
    that a step's first launch refuses with a DataError naming it (there the step fails and the session goes on)
    used to end the whole session when a top-up met it: the step raised the DataError and every later call 'the
    session failed earlier ... and cannot go on'. The step now fails as at its first launch: the DataError names
    the prompt, the engines stop as at a step's end (not paused for the caller), and the next steps go on with the
    groups in flight and the prompts after it."""
    from pdsr_sdk import RolloutSession

    judged = []

    def every_third(group, rewards):
        judged.append(group.prompt_id)
        return len(judged) % 3 == 0   # the first two groups are filtered out: the step tops up while it runs

    prompts = [{"id": f"q{i}", "prompt": f"prompt {i}"} for i in range(40)]
    prompts[2] = {"id": "bad", "prompt": ""}   # the first launch takes two: a top-up takes this one
    cfg = fake_config(tiny_model_dir, policy="baseline", over_provision=0.0)
    with RolloutSession(cfg, reward=lambda text, ground_truth=None, **_: 0.0, group_filter=every_third) as session:
        source = iter(prompts)
        with pytest.raises(DataError, match=r"step 0 prompts\[2\]: a prompt mapping needs a non-empty 'prompt'"):
            session.step(source)
        assert session.paused is None and not session.scheduler.running()
        returned = [g.prompt_id for k in range(2) for g in session.step((), last=k == 1).groups]
        assert not session.carried()
    assert len(returned) >= 4 and len(set(returned)) == len(returned) and set(returned) <= set(judged), returned
    assert "bad" not in judged and len(set(judged)) == len(judged), judged


@requires_torch
def test_after_a_partial_rollout_step_refuses_a_prompt_the_session_is_between_steps(tiny_model_dir):
    """A later step whose first launch refuses a prompt (a DataError naming it) used to leave the session in the
    middle of that step: ``session.paused`` said 'abort' where the caller had not paused (between steps it is None),
    and ``pause()`` refused with 'already paused (mode 'abort'); call resume() first', where a trainer pausing
    around its update expects it to work. The failed step now ends as a step ends: the session is between steps,
    pause and resume work, and the next step returns the carried groups."""
    from pdsr_sdk import RolloutSession

    with RolloutSession(fake_config(tiny_model_dir, policy="baseline", over_provision=1.0)) as session:
        session.step([{"id": k, "prompt": k} for k in "abcd"])
        carried = sorted(g.prompt_id for g, _ in session.carried())
        assert len(carried) == 2
        with pytest.raises(DataError, match=r"step 1 prompts\[0\]: a prompt mapping needs a non-empty 'prompt'"):
            session.step([{"id": "e", "prompt": ""}])
        assert session.paused is None
        session.pause("abort")
        assert session.paused == "abort"
        session.next_version()
        session.resume()
        assert session.paused is None and not session.scheduler.running()
        out = session.step([{"id": "f", "prompt": "f"}])
        assert sorted(g.prompt_id for g in out.groups) == carried and out.policy_version == 1
        assert [g.prompt_id for g in session.step((), last=True).groups] == ["f"]


@requires_torch
@pytest.mark.parametrize("launch", ["first", "top-up"])
def test_the_prompts_launched_with_a_refused_one_are_not_lost(tiny_model_dir, launch):
    """A launch that refuses a prompt (a DataError naming it) used to lose the other prompts it had taken from the
    source: with an iterator the caller cannot know which to give again. At a later step's first launch ('e' taken
    with the refused 'x': 'e' was never returned); at a dynamic-sampling top-up (q3 to q9 taken with 'bad' and never
    judged). They now go back to the front of the source, in order, and the next launches take them: every prompt
    but the refused one is returned (or, with a filter, judged) once, launched in the order given."""
    from pdsr_sdk import RolloutSession

    if launch == "first":   # B=2 and 4 in flight: step 1 launches two ('e' and 'x'), with 'g' and 'h' left
        given = [[{"id": k, "prompt": k} for k in "abcd"], [{"id": k, "prompt": k} for k in "exgh"]]
        given[1][1]["prompt"] = ""
        with RolloutSession(fake_config(tiny_model_dir, policy="baseline", over_provision=1.0)) as session:
            returned = [g.prompt_id for g in session.step(iter(given[0])).groups]
            with pytest.raises(DataError, match=r"step 1 prompts\[1\]: a prompt mapping needs a non-empty 'prompt'"):
                session.step(iter(given[1]))
            for k in range(3):
                returned += [g.prompt_id for g in session.step((), last=k == 2).groups]
            assert not session.carried()
        assert sorted(returned) == list("abcdegh"), returned
        return
    judged = []

    def every_third(group, rewards):
        judged.append(group.prompt_id)
        return len(judged) % 3 == 0   # the first two groups are filtered out: a top-up takes 'bad' and five more

    prompts = [{"id": f"q{i}", "prompt": f"prompt {i}"} for i in range(40)]
    prompts[2] = {"id": "bad", "prompt": ""}
    cfg = fake_config(tiny_model_dir, policy="baseline", over_provision=0.0)
    with RolloutSession(cfg, reward=lambda text, ground_truth=None, **_: 0.0, group_filter=every_third) as session:
        with pytest.raises(DataError, match=r"step 0 prompts\[2\]: a prompt mapping needs a non-empty 'prompt'"):
            session.step(iter(prompts))
        for k in range(2):
            session.step((), last=k == 1)
    given = [p["id"] for p in prompts if p["id"] != "bad"]
    # in completion order: the launched ones are the first given (the last step drains: every one is judged)
    assert len(judged) >= 8 and sorted(judged, key=given.index) == given[:len(judged)], judged


@requires_torch
@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
def test_a_hook_raising_keyboard_interrupt_reaches_the_step_and_the_session_closes(tiny_model_dir, raised):
    """A hook raising KeyboardInterrupt or SystemExit on the session's loop thread (no Ctrl-C reaches that thread:
    the hook raised it itself) ends ``step()`` with that exception, as Ctrl-C would; a later step says the session
    failed, and the ``with`` block's exit closes the engines. Before, the exception stopped the session's event
    loop, and ``step()`` waited for good."""
    from pdsr_sdk import RolloutSession

    def interrupting(group):
        raise raised("a hook stops the run")

    def run():
        with RolloutSession(fake_config(tiny_model_dir)) as session:
            session.hooks.on_group_done.append(interrupting)
            try:
                session.step(["x"])
            finally:
                session.hooks.on_group_done.clear()
                with pytest.raises(RunError, match=r"the session failed earlier \(" + raised.__name__):
                    session.step(["y"])

    error = raised_in_thread(run, f"step() never returned after a hook raised {raised.__name__}")
    assert isinstance(error, raised) and "a hook stops the run" in str(error), error
