"""The line an interrupted pdsr rollout ends with counts its finished groups in words that fit the count: one
group "was written" (it said "1 finished groups were written"), several "were"."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pdsr_sdk.rollout.run import _RunState


@pytest.mark.parametrize("n, said", [(1, "1 finished group was written"), (2, "2 finished groups were written")])
def test_the_interrupted_line_counts_its_groups(tmp_path, n, said):
    config = SimpleNamespace(output=SimpleNamespace(path=tmp_path / "o.parquet"))
    line = _RunState(writer_made=True, engines_started=True, groups_written=n).describe(config)
    assert line == f"interrupted: {said} to {tmp_path / 'o.parquet.parts'}/; rerun with --resume to continue"
