"""simulate.json's ``definitions`` say what each field of a policy's row means (docs/simulate.md says they do): the
row's utilisation was defined under the table's column name (util_<pool>), and its counters, tokens, settings,
events, sim_wall_s, batches and oracle's variants were not defined at all."""

from __future__ import annotations

import json

from click.testing import CliRunner

from pdsr_cli.main import cli
from pdsr_sdk.dispatch.run import STAT_KEYS
from support import ROOT


def test_every_field_of_a_policy_row_is_defined(tmp_path):
    result = CliRunner().invoke(cli, ["simulate", "--trace", str(ROOT / "examples" / "traces" / "synth_256x8.jsonl"),
                                      "--policy", "v2,v3", "--num-batches", "1", "--no-timeline", "--quiet",
                                      "--out-dir", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "simulate.json").read_text())
    defined, rows = data["definitions"], data["policies"]
    assert {row["policy"] for row in rows} == {"baseline", "v2", "v3", "oracle", "oracle-probe"}
    for row in rows:
        counters = [k for k, v in row.items() if k not in defined and isinstance(v, int)]
        assert set(STAT_KEYS) <= set(counters), row["policy"]
        # a counter beyond the common ones is one the policy moved (the "counters" entry says so)
        assert all(row[k] > 0 for k in counters if k not in STAT_KEYS), row["policy"]
        assert [k for k in row if k not in defined and k not in counters] == [], row["policy"]
    assert all(name in defined["counters"] for name in STAT_KEYS)
    assert "util_<pool>" not in defined and set(rows[0]["utilisation"]) == {"fast", "heavy"}
