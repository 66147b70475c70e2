"""The trainer's SDK surface (docs/sdk.md): names, prompts a step takes, weights staging, misuse
messages, and the README's trainer snippet run as written."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT, WAIT_S, requires_torch, requires_vllm
from pdsr_sdk.errors import DataError, DataValueError, RunError



def test_the_trainer_names_come_from_pdsr_sdk():
    import pdsr_sdk
    from pdsr_sdk import PromptRecord, RolloutConfig, RolloutSession, StepResult, load_config
    from pdsr_sdk.rollout.session import RolloutSession as direct

    assert RolloutSession is direct and callable(load_config) and StepResult and PromptRecord
    assert {"RolloutSession", "RolloutConfig", "StepResult", "grpo_advantages", "per_token_logps"} <= set(dir(pdsr_sdk))
    assert RolloutConfig().model is None


def test_the_synchronous_calls_need_the_session_open():
    from pdsr_sdk import RolloutConfig, RolloutSession

    session = RolloutSession(RolloutConfig(policy="baseline"))
    with pytest.raises(RunError, match=r"with RolloutSession\(config\) as session"):
        session.step(["hi"])

    async def inside():
        session.update_weights({})

    with pytest.raises(RunError, match=r"await session\.aupdate_weights"):
        asyncio.run(inside())


def test_waiting_for_an_update_is_for_partial_rollout_only():
    """A step without over_provision ends when its groups are complete: ``wait_for_update`` is refused with
    a ConfigError that says what it is for, before any engine starts."""
    from pdsr_sdk import RolloutConfig, RolloutSession
    from pdsr_sdk.errors import ConfigError

    session = RolloutSession(RolloutConfig(policy="baseline"))
    with pytest.raises(ConfigError, match=r"wait_for_update=True\) is for partial rollout"):
        asyncio.run(session.astep(["hi"], wait_for_update=True))
    assert not session._started


@requires_torch
def test_prompts_a_step_takes(tiny_model_dir):
    from pdsr_sdk.rollout.config import DataConfig
    from pdsr_sdk.rollout.data import PromptRecord, load_tokenizer, prompt_records

    tok = load_tokenizer(tiny_model_dir)
    cfg = DataConfig(system_prompt="Be brief.")
    records = prompt_records(
        ["What is 1 + 1?",
         [{"role": "user", "content": "Hi"}],
         {"prompt": "2 + 2?", "answer": "4"},
         {"id": 7, "messages": [{"role": "user", "content": "3 + 3?"}], "ground_truth": "6"},
         PromptRecord("mine", "x", [1, 2, 3])], cfg, tok, id_prefix="s0-p")
    assert [r.prompt_id for r in records] == ["s0-p0", "s0-p1", "s0-p2", "7", "mine"]
    assert [r.ground_truth for r in records] == [None, None, "4", "6", None]
    assert records[0].text.startswith("<|im_start|>system\nBe brief.<|im_end|>") and records[0].text.endswith("assistant\n")
    assert records[0].token_ids == tok(records[0].text, add_special_tokens=False)["input_ids"]
    with pytest.raises(DataError, match=r"prompts\[1\]: duplicate prompt id 'a'"):
        prompt_records([{"id": "a", "prompt": "x"}, {"id": "a", "prompt": "y"}], cfg, tok)
    with pytest.raises(DataError, match=r"prompts\[0\]: a prompt mapping needs .*'prompt'.*got keys \['text'\]"):
        prompt_records([{"text": "x"}], cfg, tok)
    with pytest.raises(DataError, match=r"prompts\[0\]: a prompt is a string.*got int"):
        prompt_records([3], cfg, tok)
    with pytest.raises(DataError, match=r"prompts\[1\]: a list of ints looks like token ids; give them as a "
                                        r"PromptRecord\(prompt_id, text, token_ids\)"):
        prompt_records(["x", [37, 81]], cfg, tok)


@requires_torch
def test_weights_are_checked_against_the_model_and_written_once_to_shared_memory(tiny_model_dir):
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk.engines.weights import WeightsBlock, stage_weights
    from pdsr_sdk.engines.weights_check import ModelWeights
    from pdsr_sdk.engines.weights_shm import read_block, write_block, write_buffer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.bfloat16)
    sd = model.state_dict()
    ref = ModelWeights.read(tiny_model_dir)
    assert ref.tied_embeddings and "lm_head.weight" in sd and "lm_head.weight" not in ref.shapes

    staged = stage_weights(sd, ref)            # the tied head is left out (vLLM skips it)
    assert [n for n, _ in staged.items] == [n for n in sd if n != "lm_head.weight"]
    try:
        block = staged.shared()
        assert Path(block.path).exists() and staged.shared() is block     # written once
        back = dict(read_block(block.path, block.size, block.entries))
        assert back.keys() == ref.shapes.keys()
        assert all(back[n].dtype == torch.bfloat16 and torch.equal(back[n], sd[n]) for n in back)
        raw = np.fromfile(block.path, dtype=np.uint8)        # as Ray's object store hands it over
        raw.flags.writeable = False
        copy = write_buffer(raw, block.entries)
        try:
            again = dict(read_block(copy.path, copy.size, copy.entries))
            assert all(torch.equal(again[n], sd[n]) for n in again)
        finally:
            os.unlink(copy.path)
    finally:
        staged.close()
    assert not Path(block.path).exists()
    forgotten = stage_weights(sd, ref)          # never closed: the block goes with the object
    path = forgotten.shared().path
    del forgotten
    assert not Path(path).exists()
    assert stage_weights(iter(sd.items()), ref).items is not None       # an iterator of pairs

    name = "model.layers.0.self_attn.q_proj.weight"
    with pytest.raises(DataValueError, match=rf"unknown parameter 'model.layers.0.self_attn.q_proj.weights'.*did you mean '{name}'"):
        stage_weights({**sd, name + "s": sd[name]}, ref)
    with pytest.raises(DataError, match=rf"parameter '{name}' has shape \[2, 2\]; .* expects \[256, 256\]"):
        stage_weights({**sd, name: torch.zeros(2, 2)}, ref)
    with pytest.raises(DataError, match=rf"1 parameter\(s\) .* missing: '{name}'"):
        stage_weights({k: v for k, v in sd.items() if k != name}, ref)
    with pytest.raises(DataError, match=r"item 0 is not a \(name, tensor\) pair"):
        stage_weights([3], ref)
    with pytest.raises(DataError, match="not a model folder"):
        stage_weights(str(tiny_model_dir / "nowhere"), ref)
    assert stage_weights(tiny_model_dir, ref).folder == str(Path(tiny_model_dir).resolve())

    # a block kept across updates (a session's): rewritten in place, kept by close(), freed by its owner
    kept = WeightsBlock()
    first = stage_weights(sd, ref, block=kept)
    assert first.shared().path == kept.path
    first.close()
    assert Path(kept.path).exists()
    halved = {n: t / 2 for n, t in sd.items()}
    second = stage_weights(halved, ref, block=kept)
    back = dict(read_block(kept.path, second.shared().size, second.shared().entries))
    assert all(torch.equal(back[n], halved[n]) for n in back)
    second.close()
    other = write_block([("x", torch.ones(3))], kept.path)      # another layout: a block of its own size
    assert other.path == kept.path and os.path.getsize(kept.path) == other.size == 64
    kept.close()
    assert not Path(kept.path).exists()


@requires_torch
def test_cpu_weights_take_the_shared_block_and_a_worker_refuses_ipc_weights_of_another_gpu(tiny_model_dir):
    """CUDA IPC is chosen only for an engine on the GPU the tensors sit on; CPU tensors always travel
    through the shared block, and an engine handed IPC handles of another device says so (as data)."""
    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk.engines.vllm_worker import PdsrWorkerExtension
    from pdsr_sdk.engines.weights import stage_weights
    from pdsr_sdk.engines.weights_check import ModelWeights
    from pdsr_sdk.engines.weights_shm import SharedWeights

    sd = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).state_dict()
    ref = ModelWeights.read(tiny_model_dir)
    staged = stage_weights(sd, ref)
    try:
        assert staged.cuda_uuid is None
        assert isinstance(staged.local("GPU-0000"), SharedWeights) and isinstance(staged.local(None), SharedWeights)
    finally:
        staged.close()

    worker = PdsrWorkerExtension()
    worker.device = torch.device("cpu")
    worker._pdsr_reference_weights = ref
    assert worker.pdsr_device_uuid() is None
    err = worker.pdsr_load_weights({"kind": "cuda_ipc", "device_uuid": "GPU-0000", "names": [], "shapes": [],
                                    "handles": b""})
    assert err is not None and err["message"] == ("the new weights are on GPU GPU-0000, shared by CUDA IPC, but "
                                                  "this engine runs on the CPU")


CUDA_IPC_READER = """
import json, pickle, sys
from pdsr_sdk.engines.weights_cuda import open_cuda_tensors
message = pickle.load(sys.stdin.buffer)
print(json.dumps({n: float(t.double().sum()) for n, t in open_cuda_tensors(message, 0)}))
"""


def has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.cuda
@pytest.mark.skipif(not has_cuda(), reason="needs a CUDA device (CUDA IPC)")
def test_cuda_ipc_weights_open_in_another_process():
    """Tensors on a GPU, shared by handle, read by another process on the same GPU (what a colocated
    engine does): same values, and a non-contiguous tensor shared through its contiguous copy."""
    import pickle

    import torch

    from pdsr_sdk.engines.weights import StagedWeights
    from pdsr_sdk.engines.weights_cuda import CudaIpcWeights

    a = torch.arange(12.0, device="cuda").view(3, 4)
    b = torch.randn(6, 5, device="cuda", dtype=torch.bfloat16).t()     # not contiguous
    staged = StagedWeights(items=[("a", a), ("b", b)])
    try:
        assert staged.cuda_uuid == str(torch.cuda.get_device_properties(0).uuid)
        ipc = staged.local(staged.cuda_uuid)
        assert isinstance(ipc, CudaIpcWeights) and ipc.shapes == ((3, 4), (5, 6))
        out = subprocess.run([sys.executable, "-c", CUDA_IPC_READER], input=pickle.dumps(ipc.message()),
                             capture_output=True, cwd=ROOT, timeout=WAIT_S)
        assert out.returncode == 0, out.stderr.decode()
        sums = json.loads(out.stdout.decode().strip().splitlines()[-1])
        assert sums == {"a": 66.0, "b": float(b.double().sum())}
    finally:
        staged.close()


def readme_trainer_snippet() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### From a trainer"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@requires_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_the_readme_trainer_snippet_runs_as_written(tmp_path):
    """Extracted from README.md and run unchanged in a fresh interpreter (spawned engine processes,
    the built-in tiny model since the snippet names none): two steps with a weight update between."""
    script = tmp_path / "trainer.py"
    script.write_text(readme_trainer_snippet())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-5000:]
    lines = [line.split() for line in out.stdout.strip().splitlines()]
    # step, the policy version of its segments, rows (B=4 x N=4), tokens/s
    assert [(line[0], line[1], line[2]) for line in lines] == [("0", "0", "16"), ("1", "1", "16")]
    assert "Traceback" not in out.stderr


@requires_torch
def test_a_prompt_past_the_sessions_context_names_the_setting_that_raises_it(tiny_model_dir):
    """The automatic layout gives a session's engines ``sampling.max_tokens + 1024`` tokens of context
    (docs/sdk.md): a longer prompt is a DataError naming it, the limit and ``engine_defaults.max_model_len``
    (the session goes on); with that set, the same prompt runs (fake engines from the layout)."""
    from pdsr_sdk import RolloutConfig, RolloutSession
    from pdsr_sdk.rollout.data import PromptRecord

    def config(**defaults):
        return RolloutConfig(model=str(tiny_model_dir), policy="baseline", fast=1, heavy=0,
                             sampling={"n": 2, "max_tokens": 16},
                             engine_defaults={"backend": "fakes:LoopEngine", **defaults})

    long = PromptRecord("long", "", [5] * 1100)
    with RolloutSession(config()) as session:
        assert [e.spec.max_model_len for e in session.engines] == [16 + 1024]
        with pytest.raises(DataError, match=r"step 0: prompt 'long': 1100 prompt tokens \+ 16 response tokens "
                                            r"\(sampling.max_tokens\) = 1116 exceed the engines' context of 1040 "
                                            r"tokens \(the session's default, sampling.max_tokens \+ 1024; raise it "
                                            r"with engine_defaults=\{'max_model_len': \.\.\.\}\)"):
            session.step([long])
        assert len(session.step([PromptRecord("short", "", [5] * 1000)]).samples) == 2
    with RolloutSession(config(max_model_len=2048)) as session:
        assert len(session.step([long]).samples) == 2
        with pytest.raises(DataError, match=r"context of 2048 tokens \(engine_defaults.max_model_len\)"):
            session.step([PromptRecord("longer", "", [5] * 2040)])


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
    assert isinstance(got.get("error"), RunError) and "the session was closed while this call waited" in str(got["error"])


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


def test_a_reward_that_is_not_callable_is_an_error_before_any_engine():
    """``reward=3`` used to be taken (a failed signature read as a builtin's) and every sample got a reward error;
    docs/sdk.md says a reward pdsr cannot call is an error before any engine starts."""
    from pdsr_sdk import RolloutConfig, RolloutSession
    from pdsr_sdk.errors import ConfigError

    for bad in (3, "pkg.mod:fn"):
        with pytest.raises(ConfigError, match=rf"reward 'reward': {re.escape(repr(bad))} \({type(bad).__name__}\) is "
                                              rf"not callable; give a function: fn\(response_text, ground_truth"):
            RolloutSession(RolloutConfig(policy="baseline"), reward=bad)


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
