"""Package-wide guarantees: light imports, fresh schemas, described configs, loud registries, small modules."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import BaseModel

from pdsr_sdk.config import ConfigModel, load_config
from pdsr_sdk.config.catalog import config_models, render_schemas
from pdsr_sdk.errors import ConfigError, PdsrError
from pdsr_sdk.registry import Registry
from support import ROOT

HEAVY = ("torch", "vllm", "numba", "ray", "matplotlib", "transformers", "pyarrow.parquet")


def _imported_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_pdsr_sdk_is_light():
    mods = _imported_after("import pdsr_sdk, pdsr_sdk.config, pdsr_sdk.registry")
    assert not [m for m in HEAVY if m in mods]


def test_cli_help_is_light_and_lists_every_command():
    mods = _imported_after("from click.testing import CliRunner\nfrom pdsr_cli.main import cli\n"
                           "r = CliRunner().invoke(cli, ['--help']); assert r.exit_code == 0, r.output")
    assert not [m for m in HEAVY if m in mods]
    out = subprocess.run([sys.executable, "-m", "pdsr_cli.main", "--help"], capture_output=True, text=True, cwd=ROOT)
    for name in ("rollout", "score", "gae", "simulate", "analyze", "trace", "serve", "model", "schema"):
        assert name in out.stdout


def test_checked_in_schemas_are_current():
    rendered = render_schemas()
    stale = [name for name, text in rendered.items()
             if not (ROOT / "schemas" / name).exists() or (ROOT / "schemas" / name).read_text() != text]
    assert not stale, f"schemas out of date (run `pdsr schema`): {stale}"
    extra = {p.name for p in (ROOT / "schemas").glob("*.json")} - set(rendered)
    assert not extra, f"schemas/ has files no model produces: {sorted(extra)}"


def _models(model: type[BaseModel], seen=None):
    seen = seen if seen is not None else set()
    if model in seen:
        return
    seen.add(model)
    yield model
    for field in model.model_fields.values():
        for sub in _nested(field.annotation):
            yield from _models(sub, seen)


def _nested(annotation):
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        yield from _nested(arg)


@pytest.mark.parametrize("name", sorted(config_models()))
def test_every_config_field_is_described_and_extra_keys_are_forbidden(name):
    for model in _models(config_models()[name]):
        assert issubclass(model, ConfigModel), f"{model.__name__} must subclass ConfigModel"
        assert model.model_config.get("extra") == "forbid"
        missing = [f for f, info in model.model_fields.items() if not info.description]
        assert not missing, f"{model.__name__}: fields without description: {missing}"


def test_config_errors_name_the_file_and_dotted_key(tmp_path):
    from pdsr_sdk.rollout.config import RolloutConfig

    cfg = tmp_path / "run.yaml"
    cfg.write_text("sampling:\n  n: 0\nengines:\n  - name: a\n    pool: fast\n    max_num_sqs: 3\n")
    with pytest.raises(ConfigError) as exc:
        load_config(RolloutConfig, cfg)
    text = str(exc.value)
    assert "run.yaml: sampling.n" in text
    assert "engines.0.max_num_sqs: unknown config key" in text and "max_num_seqs" in text


def test_config_flags_override_the_file_and_are_named_as_command_line(tmp_path):
    from pdsr_sdk.rollout.config import RolloutConfig

    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"sampling": {"n": 4, "temperature": 0.5}}))
    c = load_config(RolloutConfig, cfg, {"sampling.n": 16, "sampling.top_p": None})
    assert c.sampling.n == 16 and c.sampling.temperature == 0.5 and c.sampling.top_p == 1.0
    with pytest.raises(ConfigError, match="command line: sampling.n"):
        load_config(RolloutConfig, cfg, {"sampling.n": -1})
    with pytest.raises(ConfigError, match="  --n: sampling.n"):   # the CLI names the flag it came from
        load_config(RolloutConfig, cfg, {"sampling.n": -1}, origins={"sampling.n": "--n"})


def test_config_file_problems_are_clear(tmp_path):
    from pdsr_sdk.rollout.config import RolloutConfig

    with pytest.raises(ConfigError, match="missing.yaml: cannot read"):
        load_config(RolloutConfig, tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("sampling: [1, 2\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config(RolloutConfig, bad)
    top = tmp_path / "list.yaml"
    top.write_text("- 1\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(RolloutConfig, top)


def test_registry_fails_loudly():
    reg: Registry[int] = Registry("widget")
    reg.register("a", 1)
    with pytest.raises(PdsrError, match="widget 'a' is already registered"):
        reg.register("a", 2)
    with pytest.raises(PdsrError, match="unknown widget 'b'; valid names: a"):
        reg.get("b")
    reg.register("lazy", "json:dumps")
    assert reg.get("lazy") is json.dumps
    assert reg.get("json:loads") is json.loads
    with pytest.raises(PdsrError, match="cannot import module"):
        reg.get("no_such_module_xyz:thing")
    reg.unregister("lazy")
    assert reg.names() == ["a"]
    with pytest.raises(PdsrError, match="unknown widget 'lazy'; valid names: a"):
        reg.unregister("lazy")


def test_sample_prompts_in_examples_match_the_generator(tmp_path):
    from pdsr_sdk.rollout.sample_data import write_sample_prompts

    write_sample_prompts(tmp_path / "s.jsonl")
    assert (tmp_path / "s.jsonl").read_text() == (ROOT / "examples" / "sample_prompts.jsonl").read_text()


def test_ci_runs_the_readme_test_command_word_for_word():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(block) == 2, "the README starts with exactly two commands"
    assert "pdsr rollout" in block[0]
    assert block[1] in (ROOT / ".ci" / "run").read_text()


def test_atomic_writes_replace_whole_files_with_the_usual_permissions(tmp_path):
    import os
    import stat

    import pyarrow as pa
    import pyarrow.parquet as pq

    from pdsr_sdk.io.tables import write_table_atomic, write_text_atomic

    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    usual = stat.S_IMODE(os.stat(plain).st_mode)
    out = write_table_atomic(pa.table({"a": [1, 2]}), tmp_path / "sub" / "t.parquet")
    write_table_atomic(pa.table({"a": [3]}), out)
    assert pq.read_table(out)["a"].to_pylist() == [3]
    summary = write_text_atomic('{"ok": 1}', tmp_path / "s.json")
    assert summary.read_text() == '{"ok": 1}'
    assert {stat.S_IMODE(os.stat(p).st_mode) for p in (out, summary)} == {usual}
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["t.parquet"]   # no temp files left


@pytest.mark.parametrize("name, ok", [("o.parquet", True), ("o.PARQUET", True), ("o.pq", True), ("o", True),
                                      ("o.csv", False), ("o.jsonl", False), ("o.json", False), ("o.arrow", False)])
def test_an_output_path_must_not_name_another_format(name, ok):
    from pathlib import Path

    from pdsr_sdk.gae.config import GaeConfig
    from pdsr_sdk.rollout.config import RolloutConfig

    for build in (lambda: GaeConfig(data="i.parquet", out=name), lambda: RolloutConfig(output={"path": name})):
        if ok:
            build()
        else:
            with pytest.raises(ValueError, match=f"{name}: this output is written as Parquet, not {Path(name).suffix}"):
                build()


def test_engine_errors_survive_pickling():
    import pickle

    from pdsr_sdk.errors import EngineError

    err = EngineError("fast-0", "engine core died", exit_status=-9, remote_traceback="Traceback: boom")
    back = pickle.loads(pickle.dumps(err))
    assert (back.engine, back.exit_status, back.remote_traceback, str(back)) == \
        ("fast-0", -9, "Traceback: boom", str(err))


def test_lazy_package_attributes_load_on_use_and_fail_clearly():
    import pdsr_sdk
    import pdsr_sdk.rollout

    assert "compute_gae" in dir(pdsr_sdk) and "RolloutSession" in dir(pdsr_sdk.rollout)
    from pdsr_sdk.gae import compute_gae

    assert pdsr_sdk.compute_gae is compute_gae and vars(pdsr_sdk)["compute_gae"] is compute_gae   # cached
    with pytest.raises(AttributeError, match="module 'pdsr_sdk.rollout' has no attribute 'nope'"):
        pdsr_sdk.rollout.nope  # noqa: B018


def test_modules_stay_small():
    """Files stay small and single-purpose: no module of the package is over 400 lines, v3's coordinator (the
    policy that hands each hook to its rules) at most 300 (issue 48). A module that grows past it is split."""
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines())
             for package in ("pdsr_sdk", "pdsr_cli") for p in (ROOT / package).rglob("*.py")}
    assert len(sizes) > 100   # the walk found the package
    over = sorted(f"{name} ({n} lines)" for name, n in sizes.items() if n > 400)
    assert not over, f"modules over 400 lines: {', '.join(over)}"
    assert sizes["pdsr_sdk/policies/v3/policy.py"] <= 300
