"""Every error a user can cause is a PdsrError subclass: the CLI prints one line naming the key, flag or
file and what was expected (exit 2, no traceback); the SDK's also subclass ValueError/RuntimeError."""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from pdsr_cli.common import handle_errors
from pdsr_cli.main import cli
from pdsr_sdk.analysis import stats
from pdsr_sdk.dispatch.policy import Policy
from pdsr_sdk.errors import ConfigValueError, DataValueError, PdsrError, RunError
from pdsr_sdk.traces import synth_trace, write_trace_jsonl


def clean(r, *fragments):
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    for f in fragments:
        assert f in r.output, r.output


def test_config_range_errors_name_the_keys(tmp_path):
    trace = write_trace_jsonl(synth_trace(groups=2, n=2, seed=0), tmp_path / "t.jsonl")
    run = CliRunner().invoke
    clean(run(cli, ["simulate", "--trace", str(trace), "--segment-min", "100", "--segment-max", "10"]),
          "segments", "min_tokens (100) must be <= max_tokens (10)")
    clean(run(cli, ["simulate", "--trace", str(trace), "--fast", "0", "--heavy", "0"]),
          "fast (--fast) + heavy (--heavy) is 0")
    clean(run(cli, ["trace", "synth", "--out", str(tmp_path / "s.jsonl"), "--min-length", "10", "--max-length", "5"]),
          "min_length (10) must be <= max_length (5)")
    clean(run(cli, ["gae", "--data", str(tmp_path / "x.parquet"), "--out", str(tmp_path / "o.parquet"),
                    "--device", "tpu"]),
          "device", "expected cpu, cuda or cuda:N, got 'tpu'")


def test_sdk_errors_are_pdsr_errors_and_the_builtin_kind_callers_catch():
    with pytest.raises(DataValueError, match=r"\[G, N\]") as exc:
        stats.top_k_prob([1, 2, 3], 1)
    assert isinstance(exc.value, ValueError) and isinstance(exc.value, PdsrError)
    with pytest.raises(ConfigValueError, match=r"fraction must be in \(0, 1\], got 2"):
        stats.top_k_count(10, 2)
    with pytest.raises(ConfigValueError, match="capture_top must be >= 1"):
        stats.batch_capture([[1, 2], [3, 4]], batch_prompts=2, capture_top=0)


def test_no_live_engine_to_probe_is_a_run_error():
    class NoEngines:
        def pools(self):
            return {}

    with pytest.raises(RunError, match=r"no live engine in pool\(s\) fast to run probes") as exc:
        Policy(None, NoEngines()).submit_probes([], ("fast",))
    assert isinstance(exc.value, RuntimeError)


def test_the_cli_prints_any_pdsr_error_in_one_line():
    @click.command()
    @handle_errors
    def boom():
        raise RunError("policy 'x': no live engine in pool(s) heavy to run probes")

    r = CliRunner().invoke(boom, [])
    clean(r, "error: policy 'x': no live engine in pool(s) heavy to run probes")


def test_sdk_config_overrides_are_validated_naming_the_key():
    from pdsr_sdk.errors import ConfigError

    with pytest.raises(ConfigError, match=r"groups: Input should be greater than or equal to 1"):
        synth_trace(groups=0)


@pytest.mark.parametrize("build, key, expected", [
    ("pdsr_sdk.sim.config:SimulateConfig", dict(fast=0, heavy=0), "fast + heavy is 0"),
    ("pdsr_sdk.sim.config:SimulateConfig", dict(segments={"min_tokens": 100, "max_tokens": 10}),
     "segments: min_tokens (100) must be <= max_tokens (10)"),
    ("pdsr_sdk.sim.config:SimulateConfig", dict(fastt=2), "fastt: unknown config key; valid keys here: "),
    ("pdsr_sdk.gae.config:GaeConfig", dict(data="a", out="b.parquet", estimator="grpo", lam=0.9),
     "lam (--lam) does not apply to estimator 'grpo'"),
    ("pdsr_sdk.gae.config:GaeConfig", dict(device="tpu"), "device: expected cpu, cuda or cuda:N, got 'tpu'"),
    ("pdsr_sdk.gae.config:GaeConfig", dict(backend="fast"),
     "backend: unknown GAE backend 'fast'; valid names: auto, numba, reference, torch, triton"),
    ("pdsr_sdk.rollout.config:RolloutConfig", dict(sampling={"n": 0}),
     "sampling.n: Input should be greater than or equal to 1"),
])
def test_configs_built_in_python_raise_pdsr_errors_naming_the_key(build, key, expected):
    """An SDK user building a config directly gets the CLI's message (class name, dotted key, what was
    expected) as a ConfigValueError, which is still a ValueError like pydantic's own error."""
    from pdsr_sdk.registry import import_object

    model = import_object(build)
    with pytest.raises(ConfigValueError) as exc:
        model(**key)
    assert isinstance(exc.value, ValueError)
    assert f"{model.__name__}: {expected}" in str(exc.value)


def test_sdk_policy_set_for_an_unselected_policy_is_an_error():
    """The rule the CLI's --set follows lives in the SDK: a setting aimed at a policy that is not selected
    would change nothing."""
    from pdsr_sdk.errors import ConfigError
    from pdsr_sdk.policies.resolve import with_policy_sets
    from pdsr_sdk.sim.config import SimulateConfig

    cfg = SimulateConfig(policy="v3")
    with pytest.raises(ConfigError, match=r"policy setting v2:steal: policy 'v2' is not selected; the selected "
                                          r"policy is v3"):
        with_policy_sets(cfg, [("v2", "steal", False)])
    with pytest.raises(ConfigError, match=r"v9:steal: policy 'v9' is not a known policy"):
        with_policy_sets(cfg, [("v9", "steal", False)])
    assert with_policy_sets(cfg, [("v3", "lane.seqs", 32)]).policy_settings["v3"].lane.seqs == 32


def test_an_import_path_finds_a_users_module_in_the_working_directory(tmp_path, monkeypatch):
    """`pdsr rollout --agent mymod:run` from the folder holding mymod.py works from the `pdsr` script too (which,
    unlike `python -m`, does not put the working directory on sys.path); a module found nowhere stays an error."""
    import sys

    from pdsr_sdk.errors import PdsrError
    from pdsr_sdk.registry import import_object

    (tmp_path / "pdsr_user_agent_mod.py").write_text("async def run(agent):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert import_object("pdsr_user_agent_mod:run").__name__ == "run"
    with pytest.raises(PdsrError, match="cannot import module 'pdsr_no_such_mod'"):
        import_object("pdsr_no_such_mod:run")


def test_an_import_path_naming_a_module_asks_for_the_object_after_a_colon(tmp_path, monkeypatch):
    """`--agent pkg.agent_mod` (the colon and the function left out) said only that 'pkg' has no attribute
    'agent_mod'; it now says the path is a module and shows the form with the object named."""
    import sys

    from pdsr_sdk.errors import ConfigValueError
    from pdsr_sdk.registry import import_object

    (tmp_path / "pdsr_user_pkg").mkdir()
    (tmp_path / "pdsr_user_pkg" / "agent_mod.py").write_text("async def run(agent):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pdsr_user_pkg", raising=False)
    with pytest.raises(ConfigValueError, match=r"'pdsr_user_pkg\.agent_mod' is a module, not an agent: name the agent "
                                               r"in it after a colon, 'pdsr_user_pkg\.agent_mod:NAME'"):
        import_object("pdsr_user_pkg.agent_mod", kind="agent")
    assert import_object("pdsr_user_pkg.agent_mod:run").__name__ == "run"
    with pytest.raises(ConfigValueError, match=r"module 'pdsr_user_pkg' has no attribute 'other'"):
        import_object("pdsr_user_pkg.other", kind="agent")


def config_keys() -> set[str]:
    """Every config key of every command, nested ones dotted (``output.path``, ``out_dir``)."""
    from pdsr_sdk.config.catalog import CONFIG_MODELS

    def walk(model, prefix):
        for name, field in model.model_fields.items():
            yield prefix + name
            sub = next((a for a in (field.annotation, *getattr(field.annotation, "__args__", ()))
                        if hasattr(a, "model_fields")), None)
            if sub is not None:
                yield from walk(sub, f"{prefix}{name}.")

    return {key for name in CONFIG_MODELS.names() for key in walk(CONFIG_MODELS.get(name), "")}


FLAG_THEN_KEY = re.compile(r"(--[a-z][a-z-]*) \(([a-z_]+(?:\.[a-z_]+)*)\)")


def flag_first(text: str, keys: set[str]) -> list[str]:
    """``--flag (config.key)`` in ``text``: the other order than pdsr's errors name a setting in."""
    return [m.group(0) for m in FLAG_THEN_KEY.finditer(text) if m.group(2) in keys]


def test_errors_name_a_setting_as_its_config_key_then_the_flag():
    """One order everywhere (``output.path (--out)``, as ``pdsr score``, ``pdsr gae``, the resume checks and the
    column errors write it): ``pdsr rollout`` and ``pdsr simulate`` wrote ``--out (output.path)``."""
    from support import ROOT

    keys = config_keys()
    assert {"output.path", "out_dir", "data.path", "sampling.max_tokens"} <= keys
    assert flag_first('raise DataError(f"--out (output.path) {p}: x") # --out-dir (real.json)', keys) == [
        "--out (output.path)"]
    found = [f"{path.relative_to(ROOT)}: {hit}" for folder in ("pdsr_sdk", "pdsr_cli")
             for path in sorted((ROOT / folder).rglob("*.py")) for hit in flag_first(path.read_text(), keys)]
    assert found == []


def test_a_whole_model_check_names_the_flags_given_and_no_model():
    """A check of several keys names them itself: each key the command has a flag for gets it (``key (--flag)``, as
    a key's own error), once, whole words only; on the command line without a file, no model name before it."""
    from pydantic import ValidationError

    from pdsr_sdk.config.base import format_validation_error
    from pdsr_sdk.sim.config import SimulateConfig

    try:
        SimulateConfig.model_validate({"fast": 0, "heavy": 0, "max_staleness": 2})
    except ValidationError as exc:
        error = exc
    flags = {"fast": "--fast", "heavy": "--heavy"}
    cli_text = format_validation_error(error, SimulateConfig, overrides={"fast": 0, "heavy": 0}, origins=flags)
    assert cli_text.splitlines()[1].strip() == ("fast (--fast) + heavy (--heavy) is 0: a simulation needs at least "
                                                "one engine")
    in_file = format_validation_error(error, SimulateConfig, source="run.yaml", overrides={}, origins={})
    assert in_file.splitlines()[1].strip() == "run.yaml: fast + heavy is 0: a simulation needs at least one engine"
    sdk_text = format_validation_error(error, SimulateConfig)
    assert sdk_text.splitlines()[1].strip() == ("SimulateConfig: fast + heavy is 0: a simulation needs at least one "
                                                "engine")
    from pdsr_sdk.config.base import _with_flags

    assert (_with_flags("steps_x and steps, then steps", {"steps": "--steps"})
            == "steps_x and steps (--steps), then steps")
    assert _with_flags("a.b.steps and steps (--steps)", {"steps": "--steps"}) == "a.b.steps and steps (--steps)"
    assert _with_flags("--out is <out>.parts/; out", {"out": "--out"}) == "--out is <out>.parts/; out (--out)"
