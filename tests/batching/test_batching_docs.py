"""docs/scoring-gae.md's mapping from verl's micro-batching to pdsr_sdk.batching runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADING = "### Replacing verl's rearrange_micro_batches / _balance_batch"


def snippet() -> str:
    text = (ROOT / "docs" / "scoring-gae.md").read_text()
    assert HEADING in text, f"no {HEADING!r} in docs/scoring-gae.md"
    return re.search(r"```python\n(.*?)```", text[text.index(HEADING):], re.S).group(1)


def test_the_verl_mapping_snippet_runs_as_written(tmp_path):
    # A fresh interpreter, so the snippet's own imports are what it needs; its asserts check the
    # restored order against the unbatched rows and the equal-size split.
    script = tmp_path / "snippet.py"
    script.write_text(snippet())
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    assert out.returncode == 0, out.stderr
