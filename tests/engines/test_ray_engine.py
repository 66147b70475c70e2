"""Engines as Ray actors (backend ``ray``) on a local Ray cluster, CPU build, tiny model.

One Ray cluster and two engines are started once for the module: two Ray
actors (``fast-ray-0`` pinned to core 0 and ``heavy-ray-1`` pinned to core 1
through ``VLLM_CPU_OMP_THREADS_BIND`` in the actors' environment). The session's
local engine ``fast-0`` (core 0, tests/conftest.py) serves as the reference and
as the local half of mixed pools. All use float32 and greedy sampling, so every sample of
a prompt is a prefix of one greedy sequence, whichever engines generated its
segments. The last two tests kill one actor each (``fast-ray-0``, then
``heavy-ray-1``); they run after the others in file order.

The Ray section of the config, the layout and the message when Ray is not
installed: test_ray_config.py.
"""

from __future__ import annotations

import asyncio
import time

import pyarrow.parquet as pq
import pytest

from support import WAIT_S, requires_ray, requires_vllm, run_on
from pdsr_sdk.config import load_config
from pdsr_sdk.errors import EngineError
from pdsr_sdk.rollout.config import EngineSpec, RayConfig, RolloutConfig
from workloads import LENGTHS, write_replay_prompts



def ray_test(fn):
    """Needs Ray (a local cluster is started once for the module)."""
    return pytest.mark.ray(requires_ray(fn))


def engine_test(fn):
    """Needs Ray and vLLM: CPU vLLM engines in Ray actors (slow: they start in a minute or more)."""
    return pytest.mark.slow(pytest.mark.vllm(requires_vllm(ray_test(fn))))


def _spec(name="e", pool="fast", **kw) -> EngineSpec:
    return EngineSpec(name=name, pool=pool, **kw)


# ------------------------------------------------------- on a Ray cluster
@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    # a cluster of its own, also where `ray start` left one running on this machine (ray.init would join it)
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.mark.parametrize("what", ["resources", "placement_group"])
@ray_test
def test_an_engine_ray_cannot_place_fails_with_what_was_missing(what, ray_cluster, engine_loop):
    from pdsr_sdk.engines.ray_engine import RayEngine

    if what == "resources":
        spec, ray_cfg = _spec("nowhere"), RayConfig(resources={"no_such_node": 1}, placement_timeout_s=2)
    else:   # a tensor-parallel group of GPUs on a cluster without any
        spec, ray_cfg = _spec("nowhere", tensor_parallel_size=2), RayConfig(num_gpus=1, placement_timeout_s=2)
    engine = RayEngine.from_spec(spec, model="unused", ray=ray_cfg)
    with pytest.raises(EngineError) as info:
        run_on(engine_loop, engine.start(), timeout=WAIT_S)
    msg = str(info.value)
    assert "engine 'nowhere'" in msg and "within 2 s" in msg and "CPU: 4" in msg
    assert ("no_such_node: 1" in msg) if what == "resources" else ("placement group" in msg and "GPU" in msg)
    run_on(engine_loop, engine.close())
    # ray.kill returns before the cluster drops the actor's name: wait for it (a loaded machine takes a while)
    assert not _named_actors_left(ray_cluster, "nowhere")


@ray_test
def test_automatic_layout_with_a_ray_section_makes_ray_engines(ray_cluster):
    from pdsr_sdk.rollout.layout import engine_layout

    cfg = load_config(RolloutConfig, None, {"ray.address": "auto", "ray.num_cpus": 0.5})
    specs = engine_layout(cfg, required_pools=("fast", "heavy"), cpu=False, max_model_len=512)
    # the cluster has no GPU: the CPU layout (one fast, one heavy, cores split), every engine on Ray
    assert [(s.name, s.backend, s.ray.num_cpus) for s in specs] == [("fast-0", "ray", 0.5), ("heavy-0", "ray", 0.5)]
    assert all(s.devices for s in specs)


# ------------------------------------------------- vLLM engines in actors
@pytest.fixture(scope="module")
def engines(ray_cluster, engine_loop, tiny_model_dir, vllm_pair):
    """Two engines in Ray actors (cores 0 and 1) and the session's local ``fast-0`` (tests/conftest.py)."""
    from pdsr_sdk.engines.ray_engine import RayEngine

    common = dict(max_num_seqs=8, max_model_len=1024, dtype="float32")
    ray0 = RayEngine.from_spec(
        _spec("fast-ray-0", "fast", backend="ray", **common,
              ray={"env_vars": {"VLLM_CPU_OMP_THREADS_BIND": "0"}}),
        model=str(tiny_model_dir), ray=RayConfig(env_vars={"HF_HUB_OFFLINE": "1"}))
    ray1 = RayEngine.from_spec(
        _spec("heavy-ray-1", "heavy", backend="ray", **common,
              ray={"env_vars": {"VLLM_CPU_OMP_THREADS_BIND": "1"}}),
        model=str(tiny_model_dir), ray=RayConfig(env_vars={"HF_HUB_OFFLINE": "1"}))

    async def start_all():
        await asyncio.gather(ray0.start(), ray1.start())

    run_on(engine_loop, start_all())
    yield ray0, ray1, vllm_pair[0]
    for e in (ray0, ray1):
        run_on(engine_loop, e.close())


class Collector:
    """An EngineListener that keeps what one engine reports."""

    def __init__(self):
        self.tokens: dict[str, list[int]] = {}
        self.logprobs: dict[str, list[float]] = {}
        self.ends: dict[str, str] = {}
        self.dead: list[Exception] = []
        self.changed = asyncio.Event()

    def on_tokens(self, engine, rid, n, ids, lps):
        assert n == len(ids) and (lps is None or len(lps) == n)
        self.tokens.setdefault(rid, []).extend(ids)
        self.logprobs.setdefault(rid, []).extend(lps or [])
        self.changed.set()

    def on_segment_end(self, engine, rid, reason):
        assert rid not in self.ends, f"{rid} ended twice"
        self.ends[rid] = reason
        self.changed.set()

    def on_engine_dead(self, engine, error):
        self.dead.append(error)
        self.changed.set()

    async def wait(self, cond, timeout=WAIT_S):
        end = time.monotonic() + timeout
        while not cond():
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), max(0.01, end - time.monotonic()))


def _request(rid, ids, max_tokens):
    from pdsr_sdk.dispatch.types import SegmentRequest
    from pdsr_sdk.rollout.config import SamplingConfig

    return SegmentRequest(request_id=rid, context_ids=ids, context_len=len(ids), max_tokens=max_tokens,
                          ignore_eos=True, sampling=SamplingConfig(temperature=0.0), sample=None)


@pytest.fixture(scope="module")
def replay_data(tmp_path_factory):
    return write_replay_prompts(tmp_path_factory.mktemp("ray-data") / "prompts.jsonl")


def _config(tiny_model_dir, data, out, policy, **over) -> RolloutConfig:
    overrides = {
        "model": str(tiny_model_dir), "data.path": str(data), "data.target_lengths_column": "lengths",
        "sampling.ignore_eos": True, "sampling.n": 4, "sampling.max_tokens": 256, "sampling.temperature": 0.0,
        "batch_size": 5, "policy.name": policy, "output.path": str(out),
        "segments.min_tokens": 16, "segments.max_tokens": 64, **over,
    }
    return load_config(RolloutConfig, None, overrides)


@pytest.fixture(scope="module")
def reference(engines, engine_loop, tiny_model_dir, replay_data):
    """Each prompt's greedy continuation, generated in one go on the local engine."""
    from pdsr_sdk.rollout.data import load_prompts, load_tokenizer

    local = engines[2]
    cfg = _config(tiny_model_dir, replay_data, "unused.parquet", "baseline")
    records = load_prompts(cfg.data, load_tokenizer(str(tiny_model_dir)), path=replay_data, n=4)
    col = Collector()

    async def go():
        local.bind(col)
        for r in records:
            local.submit(_request(r.prompt_id, r.token_ids, max(LENGTHS[r.prompt_id])))
        await col.wait(lambda: len(col.ends) == len(records))

    run_on(engine_loop, go())
    assert all(col.ends[p] == "length" and len(col.tokens[p]) == max(LENGTHS[p]) for p in LENGTHS)
    return {"tokens": col.tokens, "prompts": {r.prompt_id: r.token_ids for r in records}, "records": records}


def _check_samples(rows, reference):
    """B x N samples, the forced lengths, and token ids equal to the local greedy reference."""
    assert sorted((r["prompt_id"], r["sample_index"]) for r in rows) == sorted(
        (p, i) for p in LENGTHS for i in range(4))
    for r in rows:
        want = LENGTHS[r["prompt_id"]][r["sample_index"]]
        assert r["response_length"] == len(r["response_token_ids"]) == len(r["response_logprobs"]) == want
        key = (r["prompt_id"], r["sample_index"])
        assert r["response_token_ids"] == reference["tokens"][r["prompt_id"]][:want], key


@pytest.mark.parametrize("policy", ["baseline", "v1", "v2", "v2.5"])
@engine_test
def test_every_policy_on_ray_engines_gives_the_local_engines_samples(
        policy, engines, reference, engine_loop, tiny_model_dir, replay_data, tmp_path):
    from pdsr_sdk.rollout.run import run_rollout_async

    ray0, ray1, _ = engines
    settings = {"policy.settings.offload_fraction": 0.4} if policy == "v2.5" else {}
    cfg = _config(tiny_model_dir, replay_data, tmp_path / "out.parquet", policy, **settings)
    summary = run_on(engine_loop, run_rollout_async(cfg, engines=[ray0, ray1]))
    rows = pq.read_table(cfg.output.path).to_pylist()
    _check_samples(rows, reference)
    engines_used = {seg["engine"] for r in rows for seg in r["segments"]}
    assert "fast-ray-0" in engines_used and summary.engine_errors == []
    if policy in ("baseline", "v2.5"):   # baseline splits the batch over both; v2.5 offloads 2 of 5 prompts
        assert engines_used == {"fast-ray-0", "heavy-ray-1"}
    if policy == "v2.5":   # samples past the fast cap moved from one actor to the other mid-sample
        moved = [r for r in rows if r["moves"]]
        assert moved and all({s["engine"] for s in r["segments"]} == {"fast-ray-0", "heavy-ray-1"} for r in moved)


@engine_test
def test_a_pool_of_local_engines_and_a_pool_of_ray_engines_pass_samples_between_them(
        engines, reference, engine_loop, tiny_model_dir, replay_data, tmp_path):
    from pdsr_sdk.rollout.run import run_rollout_async

    _, ray1, local = engines
    cfg = _config(tiny_model_dir, replay_data, tmp_path / "out.parquet", "v2.5",
                  **{"policy.settings.offload_fraction": 0.4})
    run_on(engine_loop, run_rollout_async(cfg, engines=[local, ray1]))
    rows = pq.read_table(cfg.output.path).to_pylist()
    _check_samples(rows, reference)
    moved = [r for r in rows if r["moves"]]   # broke the fast cap on the local engine, finished in the actor
    assert moved and all([s["engine"] for s in r["segments"]][-1] == "heavy-ray-1" and
                         r["segments"][0]["engine"] == local.name for r in moved)


@engine_test
def test_abort_mid_stream_delivers_every_token_then_abort_and_load_is_reported(engines, reference, engine_loop):
    ray0 = engines[0]
    prompt = reference["prompts"]["p0"]
    col = Collector()

    async def go():
        ray0.bind(col)
        ray0.submit(_request("long", prompt, 900))
        ray0.submit(_request("short", prompt, 7))
        await col.wait(lambda: len(col.tokens.get("long", ())) >= 20 and "short" in col.ends)
        seen_load = ray0.load()
        ray0.abort("long")
        ray0.abort("no-such-request")       # ignored
        await col.wait(lambda: "long" in col.ends)
        return seen_load

    load = run_on(engine_loop, go())
    assert col.ends == {"short": "length", "long": "abort"}
    long = col.tokens["long"]
    assert 20 <= len(long) < 900
    # greedy: the aborted stream is the start of the reference continuation (as far as it goes)
    ref = reference["tokens"]["p0"]
    assert long[:len(ref)] == ref[:len(long)] and col.tokens["short"] == ref[:7]
    assert len(col.logprobs["long"]) == len(long) and all(lp <= 0 for lp in col.logprobs["long"])
    assert load.running >= 1 and load.kv_cache_usage and load.kv_cache_usage > 0
    assert not col.dead


@engine_test
def test_a_request_the_engine_refuses_fails_alone_and_the_engine_goes_on(engines, reference, engine_loop):
    """vLLM refusing one request (a token id out of the vocabulary, at add_request) is that request's failure,
    heard as ``on_request_failed`` from the Ray actor as from a local engine, not the engine's death: a request
    beside it runs to its end."""

    class Refusals(Collector):
        def __init__(self):
            super().__init__()
            self.failed: dict[str, str] = {}

        def on_request_failed(self, engine, rid, error):
            self.failed[rid] = error
            self.changed.set()

    prompt = reference["prompts"]["p0"]
    for engine in (engines[0], engines[2]):   # in a Ray actor; local
        col = Refusals()

        async def go():
            engine.bind(col)
            engine.submit(_request("bad", [10**7], 4))
            engine.submit(_request("good", prompt, 5))
            await col.wait(lambda: "bad" in col.failed or col.dead)
            assert not col.dead, f"{engine.name}: {col.dead}"
            await col.wait(lambda: "good" in col.ends)

        run_on(engine_loop, go())
        assert "VLLMValidationError: Token id 10000000 is out of vocabulary" in col.failed["bad"], engine.name
        assert col.ends == {"good": "length"} and col.tokens["good"] == reference["tokens"]["p0"][:5]
        assert not col.dead


@engine_test
def test_update_weights_reaches_ray_engines_through_the_object_store(engines, reference, engine_loop, tiny_model_dir):
    """New weights go to both actors (Ray's object store) and the local engine (shared memory): greedy
    continuations then agree with each other and differ from the old weights'; a bad shape is refused
    inside the actor with the engine's name and node; an actor's prefix cache is reset on request
    (``next_version``) and a load may keep it (``kv_on_update: keep``); the model folder restores the old
    weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk.engines.weights import StagedWeights
    from pdsr_sdk.rollout.session import RolloutSession

    ray0, ray1, local = engines
    policy = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    torch.manual_seed(2)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    prompt = reference["prompts"]["p0"]
    cfg = _config(tiny_model_dir, "unused.jsonl", "unused.parquet", "baseline")

    async def greedy(tag):
        col = Collector()
        for e in (ray0, ray1, local):
            e.bind(col)
            e.submit(_request(f"{tag}-{e.name}", prompt, 30))
        await col.wait(lambda: len(col.ends) == 3)
        return [col.tokens[f"{tag}-{e.name}"] for e in (ray0, ray1, local)]

    async def go():
        async with RolloutSession(cfg, engines=[ray0, ray1, local]) as session:
            assert await session.aupdate_weights(policy.state_dict()) == 1
            updated = await greedy("new")
            bad = dict(policy.state_dict())
            bad["model.norm.weight"] = torch.ones(5)
            staged = StagedWeights(items=list(bad.items()))
            with pytest.raises(EngineError, match=r"engine 'heavy-ray-1'.*'model\.norm\.weight' has shape \[5\].*in its Ray actor on node") as info:
                await ray1.update_weights(staged)
            staged.close()
            assert "Traceback" not in str(info.value).split("--- engine traceback ---")[0]
            # the prefix cache through the actor: reset it (a weightless update under kv_on_update recompute),
            # and a load that keeps it (keep)
            assert await session.anext_version() == 2
            folder = StagedWeights(folder=str(tiny_model_dir))
            await ray0.update_weights(folder, reset_prefix_cache=False)
            assert await session.aupdate_weights(str(tiny_model_dir)) == 3
            restored = await greedy("old")
        return updated, restored

    updated, restored = run_on(engine_loop, go())
    ref = reference["tokens"]["p0"][:30]
    assert updated[0] == updated[1] == updated[2] != ref
    assert restored == [ref, ref, ref]


@engine_test
def test_pause_keep_and_abort_on_ray_engines_keep_every_sample_and_its_greedy_tokens(
        engines, reference, engine_loop, tiny_model_dir):
    """session.pause('keep') freezes the actors' requests (no token while paused) and pause('abort') holds
    the running samples; after a weight update (the model folder again) and resume, every sample equals
    the local greedy reference, and segments after the update carry the new version. sleep() names the
    CPU build."""
    from pdsr_sdk.errors import UnsupportedError
    from pdsr_sdk.rollout.session import RolloutSession

    ray0, ray1, _ = engines
    cfg = _config(tiny_model_dir, "unused.jsonl", "unused.parquet", "baseline")
    records = reference["records"]

    async def go():
        out = {}
        async with RolloutSession(cfg, engines=[ray0, ray1]) as session:
            sched = session.scheduler
            with pytest.raises(UnsupportedError, match=r"fast-ray-0: vLLM's CPU build cannot free engine memory"):
                await session.asleep()
            for mode in ("keep", "abort"):
                # at least half the slots running, each with a few tokens (waiting for all 16 at once missed
                # its ~0.1 s window on a loaded machine: the 8-token samples finish and the last ones start);
                # a loaded machine can also run a whole step between two polls, so a missed window runs the
                # step again
                for _ in range(5):
                    task = asyncio.ensure_future(session.astep(records))
                    end = time.monotonic() + WAIT_S
                    while not task.done() and not (len(sched.running()) >= 8
                                                   and all(s.num_generated >= 4 for s in sched.running())):
                        assert time.monotonic() < end
                        await asyncio.sleep(0.005)
                    if not task.done():
                        break
                    await task
                else:
                    pytest.fail(f"{mode}: five steps each ended before 8 samples ran with 4 tokens")
                running = set(sched.running())
                await session.apause(mode)
                generated = {s: s.num_generated for s in running}
                await asyncio.sleep(0.5)
                later = {s: s.num_generated for s in running}
                version = await session.aupdate_weights(str(tiny_model_dir))
                await session.aresume()
                out[mode] = (running, generated, later, version, await asyncio.wait_for(task, 300))
        return out

    out = run_on(engine_loop, go())
    for mode, (running, generated, later, version, result) in out.items():
        assert generated == later, mode            # nothing generated while paused
        assert len(result.samples) == 20
        for s in result.samples:
            want = LENGTHS[s.group.prompt_id][s.index]
            assert s.num_generated == len(s.token_ids) == len(s.logprobs) == want, (mode, s.key)
            assert s.token_ids == reference["tokens"][s.group.prompt_id][:want], (mode, s.key)
        # the running samples' segments: the old version up to the pause, the new one after it
        assert any(seg.end_reason == "pause" for s in running for seg in s.segments), mode
        for s in running:
            versions = [seg.policy_version for seg in s.segments if seg.num_tokens]
            assert versions == sorted(versions) and set(versions) <= {version - 1, version}, (mode, s.key)
        assert any(seg.policy_version == version for s in running for seg in s.segments if seg.num_tokens), mode


def _session_run(engine_loop, cfg, engines, records, kill_when):
    """Run one batch through a RolloutSession, calling ``kill_when(session, sample)`` after each sample."""
    from pdsr_sdk.rollout.session import RolloutSession

    async def go():
        session = RolloutSession(cfg, engines=engines, model_dir=cfg.model)
        session.hooks.on_sample_done.append(lambda s: kill_when(session, s))
        await session.start()
        try:
            return session, await session.generate(records)
        finally:
            await session.close()

    return run_on(engine_loop, go())


def _core_pids(actor_pid):
    import psutil

    return [p.pid for p in psutil.Process(actor_pid).children(recursive=True)]


def _named_actors_left(ray, fragment, timeout=WAIT_S):
    """Named actors whose name holds ``fragment``, once none is left or ``timeout`` has passed."""
    end = time.monotonic() + timeout
    while True:
        left = [a for a in ray.util.list_named_actors() if fragment in a]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.2)


def _wait_gone(pids, timeout=WAIT_S):
    import psutil

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.5)
    return alive


@engine_test
def test_killing_one_actor_mid_run_requeues_its_samples_on_the_pool(engines, reference, engine_loop,
                                                                    tiny_model_dir, replay_data, tmp_path):
    import ray

    ray0, ray1, local = engines
    children = _core_pids(ray0.node["pid"])
    assert children   # the actor's vLLM engine-core process
    cfg = _config(tiny_model_dir, replay_data, tmp_path / "o.parquet", "baseline")
    killed = {}

    def kill_when(session, sample):
        running = session.scheduler.running(ray0)
        if not killed and session.scheduler.stats["samples_finished"] >= 3 and running:
            killed["running"] = {s.key for s in running}
            ray.kill(ray0._actor)

    session, result = _session_run(engine_loop, cfg, [local, ray0, ray1], reference["records"], kill_when)
    assert killed["running"]
    samples = {s.key: s for g in result.groups for s in g.samples}
    assert len(samples) == 20 and all(s.finished for s in samples.values())
    for key, s in samples.items():
        p, i = key.split("/")
        want = LENGTHS[p][int(i)]
        assert s.num_generated == len(s.token_ids) == want
        assert s.token_ids == reference["tokens"][p][:want], key
    # every sample running on the killed actor (then, or launched before its death was known) was
    # retried on the other fast engine, unless its last tokens were already on their way back when
    # ray.kill landed: then it finished on the actor, whole, and a retry would have been waste
    retried = {k for k, s in samples.items() if s.retries}
    for key in killed["running"] - retried:
        last = samples[key].segments[-1]
        assert last.engine == "fast-ray-0" and last.end_reason in ("stop", "length"), (key, last)
    assert killed["running"] & retried
    for key in retried:
        s = samples[key]
        assert s.retries == 1 and s.segments[-1].engine == local.name
        assert [seg.engine for seg in s.segments if seg.end_reason == "engine_dead"] == ["fast-ray-0"]
    [err] = session.scheduler.engine_errors
    text = str(err)
    assert err.engine == "fast-ray-0" and ray0.node["ip"] in text and ray0.node["node_id"] in text
    assert "ActorDiedError" in text and "ray.kill" in text
    assert result.stats["engines_lost"] == 1 and result.stats["retries"] == len(retried)
    assert _wait_gone(children) == []   # no engine core left behind holding memory


@engine_test
def test_killing_the_only_actor_of_a_pool_stops_with_an_engine_error_naming_engine_and_node(
        engines, reference, engine_loop, tiny_model_dir, replay_data, tmp_path):
    import ray

    _, ray1, local = engines
    cfg = _config(tiny_model_dir, replay_data, tmp_path / "o.parquet", "v2.5")

    killed = []

    def kill_when(session, sample):
        if not killed:
            killed.append(sample.key)
            ray.kill(ray1._actor)

    with pytest.raises(EngineError) as info:
        _session_run(engine_loop, cfg, [local, ray1], reference["records"], kill_when)
    err = info.value
    text = str(err)
    assert err.engine == "heavy-ray-1"
    assert "no live engine is left in pool 'heavy'" in text
    node_ips = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    assert ray1.node["ip"] in node_ips and ray1.node["ip"] in text and ray1.node["node_id"] in text
    assert "ray.kill" in text
