"""Shared fixtures: the tiny model and vLLM's CPU environment."""

from __future__ import annotations

import sys

import pytest

from pdsr_sdk.engines.vllm_env import apply_cpu_defaults

# Before anything imports vLLM: CPU KV cache, loopback sockets, quiet logs.
apply_cpu_defaults()

from support import HAVE_TORCH  # noqa: E402  (after the vLLM environment is set)

#: session fixtures that hold real engines and serve a run of neighbouring tests: closed after the last test
#: of such a run that uses them (nothing later asks for them; were one to, it would start them again),
#: so that their engines do not sit in memory while the rest of the suite starts others
RELEASED_AFTER_THEIR_LAST_USER = ("speculative_engines", "ray_actors", "ray_cluster")
#: session fixtures holding real engines (or a Ray cluster), each with the xdist group of its users: the tests
#: of a group run on one worker, so they start once. The Ray tests (tests/engines/conftest.py) join the local
#: pair's group: those with engines in actors use both, and a cluster per worker would start twice.
SHARED_ENGINES = {"vllm_pair": "vllm_pair", "speculative_engines": "speculative_engines",
                  "ray_cluster": "vllm_pair"}


def pytest_configure(config):
    # pytest rewrites the asserts of every module of a plugin's distribution (hypothesis: 73 modules; anyio's and
    # xdist's plugins come with the environment), and with PYTHONDONTWRITEBYTECODE set, as on the shared machine,
    # it does so again on every run: about 5 s of each run's collection. Their asserts are not the tests'; ours
    # are still rewritten.
    must = getattr(getattr(config.pluginmanager, "rewrite_hook", None), "_must_rewrite", None)
    if isinstance(must, set):
        must.difference_update({"hypothesis", "anyio", "xdist"})


@pytest.hookimpl(tryfirst=True)   # before xdist reads the groups (it appends them to the test ids)
def pytest_collection_modifyitems(config, items):
    # Under xdist (addopts: `-n 2 --dist loadgroup`) tests are dealt one at a time to whichever worker is free,
    # which would start a module's (or a session's) engines once in each worker. So the tests of a module that
    # use a fixture wider than one test run on one worker, and with them those of every module sharing a
    # session's engines (or Ray cluster: SHARED_ENGINES names the group); every other test is dealt singly.
    if not config.pluginmanager.hasplugin("xdist"):
        return
    modules: dict = {}
    for item in items:
        modules.setdefault(item.path, []).append(item)
    for path, members in modules.items():
        wide, engines = [], set()
        for item in members:
            used = item._fixtureinfo.name2fixturedefs
            engines.update(SHARED_ENGINES[name] for name in used if name in SHARED_ENGINES)
            if any(name in SHARED_ENGINES or (defs and defs[-1].scope in ("module", "class", "package"))
                   for name, defs in used.items()):
                wide.append(item)
        group = min(engines) if engines else path.relative_to(config.rootpath).as_posix()
        for item in wide:
            item.add_marker(pytest.mark.xdist_group(group))
            _name_the_group(config, item, group)


def _name_the_group(config, item, group):
    # xdist (3.8) tells the controller a test's group by appending "@group" to its id in the worker, through
    # `item._nodeid`; pytest 9 keeps the id in `item._id`, so without this the groups are silently ignored.
    if getattr(config.option, "loadgroup", False) and hasattr(config, "workerinput") and hasattr(item, "_id"):
        from _pytest.nodeid import coerce_node_id

        item._id = coerce_node_id(f"{item.nodeid}@{group}")


def pytest_runtest_setup(item):
    # One torch thread in the test process: its tensors are small, and with the default (a thread per core) a
    # busy core (an engine, another process) stalls every parallel region at its barrier: tests/scoring/
    # test_scoring.py took 93 s that way on the shared 2-core machine against 21 s with one thread (load 2.4).
    # Engine and example processes are not affected (they set their own threads).
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def pytest_runtest_teardown(item, nextitem):
    for name in RELEASED_AFTER_THEIR_LAST_USER:
        if name in item.fixturenames and (nextitem is None or name not in nextitem.fixturenames):
            for fixturedef in item._fixtureinfo.name2fixturedefs.get(name, ()):
                fixturedef.finish(item._request)


@pytest.fixture(scope="session")
def tiny_model_dir():
    """The built-in tiny random Qwen2 (built once per machine, cached)."""
    if not HAVE_TORCH:
        pytest.skip("torch is not installed")
    from pdsr_sdk.models.tiny import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(autouse=True)
def _no_hub(monkeypatch):
    # Tests never reach a model hub: everything is local.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def tiny_weights(tiny_model_dir):
    """The tiny model's fp32 state dict, loaded by transformers (a trainer's), and its checkpoint's names and shapes
    (``ModelWeights``), what ``update_weights`` checks a state dict against. Per module: a test may change tensors."""
    import torch
    from transformers import AutoModelForCausalLM

    from pdsr_sdk.engines.weights_check import ModelWeights

    policy = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    return policy.state_dict(), ModelWeights.read(tiny_model_dir)


@pytest.fixture(scope="session")
def engine_loop():
    """One asyncio loop in a background thread for the whole session.

    vLLM's AsyncLLM is tied to the loop it first ran on, so engines shared
    between tests must live on one long-lived loop; tests submit coroutines
    to it with :func:`run_on`.
    """
    import asyncio
    import threading

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="engine-loop", daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=30)


@pytest.fixture(scope="session")
def vllm_pair(engine_loop, tiny_model_dir):
    """Two real vLLM engines on the tiny model, started once for the whole run and shared by the modules that
    need local engines (tests/rollout/test_rollout_vllm.py, tests/engines/test_ray_engine_*.py): ``fast-0`` on
    core 0 and ``heavy-0`` on core 1. float32, so greedy continuation after a move is bit-exact (in bf16 a
    re-prefilled context differs from step-by-step decoding in the last bits, and greedy paths can fork). A
    test that loads other weights puts the model folder's back before it ends."""
    from pdsr_sdk.engines.vllm_engine import VllmEngine
    from pdsr_sdk.rollout.config import EngineSpec
    from support import HAVE_VLLM, run_on

    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed")
    specs = [EngineSpec(name="fast-0", pool="fast", devices=[0], max_num_seqs=8, max_model_len=1024, dtype="float32"),
             EngineSpec(name="heavy-0", pool="heavy", devices=[1], max_num_seqs=8, max_model_len=1024, dtype="float32")]
    built = [VllmEngine.from_spec(s, model=str(tiny_model_dir)) for s in specs]
    try:
        for e in built:
            run_on(engine_loop, e.start())
        yield built
    finally:
        for e in built:
            run_on(engine_loop, e.close())



@pytest.fixture(scope="session")
def speculative_engines(engine_loop, tiny_model_dir, tmp_path_factory):
    """Five real vLLM engines in float32 on the repetitive variant of the tiny model
    (tests/engines/test_speculative_vllm.py says why that variant), started together once and shared by the
    speculative modules (tests/engines/test_speculative_*_vllm.py): ``ref-0`` without speculation (the reference,
    core 0), ``ngram-0`` (core 1), ``group-0`` (core 1), ``group-1`` (pool heavy, core 0: with group-0 the
    pair a session needs for the policies that use both pools) and ``ngram-2`` (core 0; drafts only while it runs
    at most 2 sequences). Only ``ngram-2`` has a batch-size limit below ``max_num_seqs``. A module binds its own
    listener.
    Closed after the last test that uses them (RELEASED_AFTER_THEIR_LAST_USER)."""
    from pathlib import Path

    from pdsr_sdk.engines.vllm_engine import VllmEngine
    from pdsr_sdk.rollout.config import EngineSpec, RolloutConfig
    from support import HAVE_VLLM, run_on

    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed")
    from test_speculative_vllm import build_repetitive_model, start_all

    model = str(build_repetitive_model(Path(tiny_model_dir), tmp_path_factory.mktemp("spec") / "model"))

    def spec(name, core, pool="fast"):
        return EngineSpec(name=name, pool=pool, devices=[core], max_num_seqs=8, max_model_len=1024,
                          dtype="float32")

    ref = VllmEngine.from_spec(spec("ref-0", 0), model=model)
    ngram = VllmEngine.from_spec(spec("ngram-0", 1), model=model,
                                 speculative=RolloutConfig(speculative="ngram").vllm_speculative_config())
    group_config = RolloutConfig(speculative="group").vllm_speculative_config()
    group = VllmEngine.from_spec(spec("group-0", 1), model=model, speculative=group_config)
    group_heavy = VllmEngine.from_spec(spec("group-1", 0, pool="heavy"), model=model, speculative=group_config)
    limited = VllmEngine.from_spec(spec("ngram-2", 0), model=model, speculative=RolloutConfig(
        speculative="ngram", speculative_settings={"max_batch_size": 2}).vllm_speculative_config())
    built = (ref, ngram, group, group_heavy, limited)
    try:
        run_on(engine_loop, start_all(*built))
        assert ref._llm.vllm_config.speculative_config is None
        assert ngram._llm.vllm_config.speculative_config is not None
        assert group._llm.vllm_config.speculative_config.method == "custom_class"
        assert group_heavy._llm.vllm_config.speculative_config.method == "custom_class"
        yield {e.name: e for e in built}
    finally:
        for e in built:
            run_on(engine_loop, e.close())
