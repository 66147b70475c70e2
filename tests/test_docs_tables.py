"""docs/configuration.md's table of each command's config (besides rollout's, which tests/test_docs.py checks) names
every key of the config model, nested ones dotted, each with the model's default.

A table is ``| key | default | what |`` under a ``### `pdsr COMMAND``` heading of "The other commands' keys"; a
row's first cell names one key or several (`` `fast`, `heavy` `` with defaults ``6, 2``). A nested model's own
row has the default ``—`` (its keys' rows say), unless the model is None by default; a model with a table of its
own (an engine profile) is not descended into.
"""

from __future__ import annotations

import re
from pathlib import PurePath

import pytest
from pydantic import BaseModel

from support import ROOT
from test_docs import config_model_in


def tables() -> dict[str, type]:
    from pdsr_sdk.analysis.config import AnalyzeConfig
    from pdsr_sdk.gae.config import GaeConfig
    from pdsr_sdk.scoring.config import ScoreConfig
    from pdsr_sdk.sim.config import CalibrateConfig, EngineProfile, SimulateConfig
    from pdsr_sdk.traces.config import TraceSynthConfig

    return {"`pdsr simulate`": SimulateConfig, "A simulate engine profile": EngineProfile,
            "`pdsr simulate calibrate`": CalibrateConfig, "`pdsr score`": ScoreConfig, "`pdsr gae`": GaeConfig,
            "`pdsr analyze`": AnalyzeConfig, "`pdsr trace synth`": TraceSynthConfig}


def documented(text: str) -> dict[str, dict[str, str]]:
    """``{heading: {dotted key: its default cell}}`` of each table of "The other commands' keys"."""
    section = text[text.index("## The other commands' keys"):]
    out: dict[str, dict[str, str]] = {}
    for heading, body in re.findall(r"^### ([^\n]+)\n(.*?)(?=^### |\Z)", section, re.M | re.S):
        rows = out.setdefault(heading.strip(), {})
        for keys, default in re.findall(r"^\| ((?:`[\w.]+`(?:, )?)+) \| ([^|]+) \|", body, re.M):
            keys = re.findall(r"`([\w.]+)`", keys)
            defaults = [default.strip()] if len(keys) == 1 else [d.strip() for d in default.split(", ")]
            if len(defaults) != len(keys):
                defaults = [default.strip()] * len(keys)   # reported as a wrong default below
            rows.update(zip(keys, defaults))
    return out


def model_keys(model: type[BaseModel], own_tables: set[type], prefix: str = "") -> dict[str, object]:
    """``{dotted key: default}`` of every field of ``model`` and of its nested models (a required field's default
    is ``required``, a nested model's own ``—``)."""
    out: dict[str, object] = {}
    for name, field in model.model_fields.items():
        key = prefix + name
        default = "required" if field.is_required() else field.get_default(call_default_factory=True)
        out[key] = "—" if isinstance(default, BaseModel) else default
        sub = config_model_in(field.annotation)
        if sub is not None and sub not in own_tables:
            out.update(model_keys(sub, own_tables, key + "."))
    return out


def read_default(cell: str):
    """A default cell as a value: ``none``, ``required``, ``—``, a number (``5e-05``), `` `text` ``, a list."""
    if cell in ("none", "required", "—"):
        return None if cell == "none" else cell
    import yaml

    value = yaml.safe_load(cell.strip("`"))
    if isinstance(value, str) and not cell.startswith("`"):
        try:
            return float(value)   # YAML 1.1 reads 5e-05 as text
        except ValueError:
            return value
    return value


def plain(value):
    """A model's default as YAML would read it back: paths as text, tuples as lists."""
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def table_problems(rows: dict[str, str], model: type[BaseModel], own_tables: set[type]) -> list[str]:
    keys = model_keys(model, own_tables - {model})
    problems = [f"{key}: not in the table" for key in keys if key not in rows]
    problems += [f"{key}: no such key" for key in rows if key not in keys]
    for key, cell in rows.items():
        if key in keys and read_default(cell) != plain(keys[key]):
            problems.append(f"{key}: the code's default is {keys[key]!r}, the table says {cell}")
    return problems


def test_every_command_config_has_a_table_naming_every_key_with_its_default():
    from pdsr_sdk.config.catalog import CONFIG_MODELS

    expected = tables()
    # a config model added to the catalog needs a table here (rollout's is the page's first)
    assert {CONFIG_MODELS.get(name) for name in CONFIG_MODELS.names() if name != "rollout"} <= set(expected.values())
    found = documented((ROOT / "docs" / "configuration.md").read_text())
    assert sorted(found) == sorted(expected)
    problems = [f"{heading}: {p}" for heading, model in expected.items()
                for p in table_problems(found[heading], model, set(expected.values()))]
    assert not problems, "docs/configuration.md:\n" + "\n".join(problems)


@pytest.mark.parametrize("row, problem", [
    ("| `gamma` | 0.99 | x |", "gamma: the code's default is 1.0, the table says 0.99"),
    ("| `gamma`, `lam` | 1.0, 0.9 | x |", "lam: the code's default is 0.95, the table says 0.9"),
    ("| `gammma` | 1.0 | x |", "gammma: no such key"),
    ("| `data` | none | x |", "data: the code's default is 'required', the table says none"),
])
def test_the_table_check_finds_a_wrong_default_a_missing_key_and_an_unknown_one(row, problem):
    from pdsr_sdk.gae.config import GaeConfig

    text = (ROOT / "docs" / "configuration.md").read_text()
    gae = documented(text)["`pdsr gae`"]
    rows = documented(f"## The other commands' keys\n\n### `pdsr gae`\n\n{row}\n")["`pdsr gae`"]
    assert problem in table_problems({**gae, **rows}, GaeConfig, set())
    left_out = {key: cell for key, cell in gae.items() if key != "whiten"}
    assert "whiten: not in the table" in table_problems(left_out, GaeConfig, set())
