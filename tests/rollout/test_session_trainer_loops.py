"""A trainer's loop around a session, as a slime / AReaL user writes it (docs/sdk.md): steps one at a time, and the
pipelined loop of docs/sdk-partial.md ending when its trainer raises (fake engines from the config, tests/fakes.py)."""

from __future__ import annotations

import asyncio

import pytest

from support import WAIT_S, requires_torch
from pdsr_sdk.errors import RunError

pytestmark = requires_torch


def fake_config(tiny_model_dir, **kw):
    """Two fake engines from the config (responses run to max_tokens)."""
    from pdsr_sdk import RolloutConfig

    return RolloutConfig(model=str(tiny_model_dir), batch_size=2, policy="baseline",
                         sampling={"n": 2, "max_tokens": 8},
                         engines=[{"name": "fast-0", "pool": "fast", "backend": "fakes:LoopEngine"},
                                  {"name": "heavy-0", "pool": "heavy", "backend": "fakes:LoopEngine"}], **kw)


@pytest.mark.parametrize("streaming", [False, True])
def test_a_second_step_while_one_runs_is_an_error_and_the_first_completes(tiny_model_dir, streaming):
    """A step (or a generate batch) started while another runs used to take over the dispatch run's batch (the
    stream's step end, with partial rollout): the first step then waited for good, and the second returned the
    first's groups under its own index. Now the second is a RunError saying steps run one at a time; the first
    returns its own groups, and the next step runs as usual."""
    from pdsr_sdk import RolloutSession
    from pdsr_sdk.rollout.data import PromptRecord

    cfg = fake_config(tiny_model_dir, **({"over_provision": 0.5, "max_staleness": 1} if streaming else {}))

    async def scenario():
        async with RolloutSession(cfg) as session:
            first = asyncio.create_task(session.astep([{"id": "a", "prompt": "a"}, {"id": "b", "prompt": "b"}]))
            await asyncio.sleep(0)   # the first step has begun: it awaits the engines
            assert not first.done()
            with pytest.raises(RunError, match=r"step: another step is running on this session; steps run one at "
                                               r"a time: call it after that step returns"):
                await session.astep(["x", "y"])
            with pytest.raises(RunError, match=r"generate: another step is running"):
                await session.generate([PromptRecord("g", "g", [1, 2, 3])])
            out = await asyncio.wait_for(first, WAIT_S)
            after = await session.astep([{"id": "c", "prompt": "c"}, {"id": "d", "prompt": "d"}], last=streaming)
            return out, after

    out, after = asyncio.run(scenario())
    assert sorted(g.prompt_id for g in out.groups) == ["a", "b"]
    assert all(len(g.samples) == 2 and all(s.token_ids for s in g.samples) for g in out.groups)
    assert after.step == out.step + 1 and sorted(g.prompt_id for g in after.groups) == ["c", "d"]


def docs_pipelined_loop() -> str:
    """The pipelined trainer's loop of docs/sdk-partial.md ("Partial rollout across steps"), as written there."""
    import re

    from support import ROOT

    text = (ROOT / "docs" / "sdk-partial.md").read_text()
    return next(block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "ThreadPoolExecutor" in block)


def test_the_docs_pipelined_loop_ends_with_the_trainers_error(tiny_model_dir):
    """docs/sdk-partial.md's pipelined loop, run as written, with a trainer that raises while step 1 waits for its
    update: the error comes out. With the executor entered after the session (as the docs had it), its exit
    joined the step's thread first, and that step waited for good for an update that never came."""
    import textwrap
    import threading

    from pdsr_sdk import RolloutSession

    class TrainerBug(Exception):
        pass

    def train(groups):
        assert len(groups) == 2   # step 0's groups, while step 1 generates
        raise TrainerBug("the trainer's own error")

    names = {"RolloutSession": RolloutSession, "num_steps": 3, "train": train, "model": None,
             "config": fake_config(tiny_model_dir, over_provision=1.0, max_staleness=1),
             "prompts": iter([f"prompt {i}" for i in range(12)])}
    got = {}

    def run():
        try:
            exec(textwrap.dedent(docs_pipelined_loop()), names)
        except BaseException as exc:  # noqa: BLE001 - what the loop raised is the test's
            got["error"] = exc

    loop = threading.Thread(target=run, daemon=True)
    loop.start()
    loop.join(WAIT_S)
    assert not loop.is_alive(), "the docs' pipelined loop hangs when its trainer raises"
    assert isinstance(got.get("error"), TrainerBug)


class WeightsLoopEngine:
    """A fake engine (tests/fakes.py's LoopEngine) that takes weight updates and ignores them."""

    @classmethod
    def from_spec(cls, spec, **kw):
        from fakes import LoopEngine

        engine = LoopEngine.from_spec(spec, **kw)

        async def update_weights(staged, reset_prefix_cache=True):
            return None

        engine.update_weights = update_weights
        return engine


def test_the_pipelined_grpo_example_ends_with_its_trainers_error(tiny_model_dir, monkeypatch):
    """examples/grpo_train.py --pipeline: an error in the trainer while the next step waits for its update comes
    out of ``train``; the example's ``with ThreadPoolExecutor`` used to join that step first, which waited for
    good (fake engines that take weights)."""
    import sys
    import threading

    import pdsr_sdk
    from support import ROOT

    if str(ROOT) not in sys.path:   # `examples` is imported by path, as tests/examples does
        sys.path.insert(0, str(ROOT))
    from examples.grpo_train import GrpoSettings, rollout_config, train
    from pdsr_sdk import EngineSpec, RolloutSession

    class TrainerBug(Exception):
        pass

    def scoring_fails(*args, **kw):
        raise TrainerBug("the trainer's own error")

    monkeypatch.setattr(pdsr_sdk, "per_token_logps", scoring_fails)
    s = GrpoSettings(steps=3, batch_size=2, n=2, max_tokens=8, over_provision=1.0, max_staleness=1, pipeline=True,
                     model=str(tiny_model_dir))
    engines = [EngineSpec(name=name, pool=pool, backend="test_session_trainer_loops:WeightsLoopEngine")
               for name, pool in (("fast-0", "fast"), ("heavy-0", "heavy"))]
    config = rollout_config(s).model_copy(update={"engines": engines})
    got = {}

    def run():
        try:
            with RolloutSession(config) as session:
                train(s, session, emit=lambda line: None)
        except BaseException as exc:  # noqa: BLE001 - what train raised is the test's
            got["error"] = exc

    loop = threading.Thread(target=run, daemon=True)
    loop.start()
    loop.join(WAIT_S)
    assert not loop.is_alive(), "the pipelined example hangs when its trainer raises"
    assert isinstance(got.get("error"), TrainerBug)


def test_pause_update_resume_between_partial_rollout_steps(tiny_model_dir):
    """slime's habit around every update: pause, load, resume. Between partial-rollout steps a step's end has
    stopped the engines, holding the carried samples' tokens: ``paused`` used to say ``abort`` there, ``pause()``
    raised "already paused ...; call resume() first", and ``resume()`` started the carried samples generating
    under the old weights while the trainer trained. Now ``paused`` is None there, ``pause()`` returns at once,
    ``resume()`` leaves the engines stopped for the next step, and a step begun while paused waits for resume."""
    from pdsr_sdk import EngineSpec, RolloutSession

    engines = [EngineSpec(name=name, pool=pool, backend="test_session_trainer_loops:WeightsLoopEngine",
                          max_num_seqs=2) for name, pool in (("fast-0", "fast"), ("heavy-0", "heavy"))]
    cfg = fake_config(tiny_model_dir, over_provision=1.0, max_staleness=1).model_copy(update={"engines": engines})
    cfg = cfg.model_copy(update={"sampling": cfg.sampling.model_copy(update={"max_tokens": 400})})

    async def scenario():
        async with RolloutSession(cfg) as session:
            sched = session.scheduler
            await session.astep(iter([f"p{i}" for i in range(12)]))
            held = {s.key: s.num_generated for s in sched.held()}
            assert held and any(held.values()) and sched.in_flight == 0 and session.paused is None
            await session.apause("abort")
            assert session.paused == "abort"
            with pytest.raises(RunError, match=r"pause: already paused \(mode 'abort'\)"):
                await session.apause("wait")
            assert await session.aupdate_weights(session._model_dir()) == 1
            await session.aresume()
            assert session.paused is None and sched.in_flight == 0   # stopped until the next step
            assert {s.key: s.num_generated for s in sched.held()} == held
            await session.aresume()   # not paused: nothing
            await session.apause("wait")
            step = asyncio.create_task(session.astep(()))
            for _ in range(20):
                await asyncio.sleep(0)
            assert not step.done() and sched.in_flight == 0 and session.paused is not None
            await session.aresume()
            return await asyncio.wait_for(step, WAIT_S)

    out = asyncio.run(scenario())
    assert len(out.groups) == 2 and out.policy_version == 1 and out.summary["max_token_age"] <= 1
    assert all(len(s.token_ids) == 400 for g in out.groups for s in g.samples)
    assert any(seg.policy_version == 1 for g in out.groups for s in g.samples for seg in s.segments)


def test_a_pause_wait_across_a_partial_rollout_steps_end_holds_until_resume(tiny_model_dir):
    """A trainer thread's ``pause("wait")`` in the middle of a partial-rollout step lets the running samples finish;
    when they completed the step, the step's end cleared the caller's pause: ``paused`` read None and the next step
    started generating before ``resume()`` (under weights the trainer was still loading). Now the pause holds across
    the step's end: ``paused`` says so, and the next step waits, generating nothing, until ``resume()``."""
    from pdsr_sdk import RolloutSession

    cfg = fake_config(tiny_model_dir, over_provision=1.0, max_staleness=1)
    cfg = cfg.model_copy(update={"sampling": cfg.sampling.model_copy(update={"max_tokens": 4000})})

    async def scenario():
        async with RolloutSession(cfg) as session:
            sched = session.scheduler
            first = asyncio.create_task(session.astep(iter([f"p{i}" for i in range(12)])))
            while not first.done() and not (sched.in_flight and any(s.num_generated for s in sched.running())):
                await asyncio.sleep(0.001)
            assert not first.done() and sched.in_flight == 8   # every sample of the step's 4 groups runs
            await session.apause("wait")   # returns once none runs: every running sample finished
            out = await asyncio.wait_for(first, WAIT_S)   # their groups completed the step
            assert session.paused == "wait" and sched.in_flight == 0
            # the other two groups completed too: the next step is whole before it begins and generates nothing
            second = await asyncio.wait_for(session.astep(()), WAIT_S)
            assert session.paused == "wait" and sched.in_flight == 0
            third = asyncio.create_task(session.astep(()))
            for _ in range(20):
                await asyncio.sleep(0)
            assert not third.done() and sched.in_flight == 0 and session.paused is not None
            await session.aresume()
            return out, second, await asyncio.wait_for(third, WAIT_S)

    steps = asyncio.run(scenario())
    assert [len(out.groups) for out in steps] == [2, 2, 2]
    assert all(len(s.token_ids) == 4000 for out in steps for g in out.groups for s in g.samples)
