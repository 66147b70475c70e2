"""A big prompt file shows a progress bar while it is tokenized (before the engines start), counting every row once;
a small one opens none. The prompts are the same with the bar as without."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from pdsr_sdk.rollout.config import DataConfig
from pdsr_sdk.rollout.data import encode_messages, load_prompts, load_tokenizer


class RecordingBar:
    bars: list["RecordingBar"] = []

    def __init__(self, desc="", total=None, unit="it"):
        self.desc, self.total, self.unit, self.updates, self.closed = desc, total, unit, [], False
        RecordingBar.bars.append(self)

    def update(self, n=1):
        assert not self.closed
        self.updates.append(n)

    def set_postfix_str(self, s="", refresh=True):
        pass

    def close(self):
        self.closed = True


def write_prompts(path, rows):
    pq.write_table(pa.table({"problem": [f"what is {i} plus {i % 7}?" for i in range(rows)],
                             "answer": [str(i + i % 7) for i in range(rows)]}), path)
    return path


def test_tokenizing_a_big_file_counts_every_row_once(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setattr("pdsr_sdk.rollout.data.TOKENIZE_BAR_ROWS", 1000)
    tok = load_tokenizer(tiny_model_dir)
    cfg = DataConfig()
    for rows in (2048, 2500):   # a whole number of the bar's steps, and not
        path = write_prompts(tmp_path / f"p{rows}.parquet", rows)
        RecordingBar.bars = []
        records = load_prompts(cfg, tok, path=path, progress=RecordingBar)
        [bar] = RecordingBar.bars
        assert (bar.desc, bar.total, bar.unit, bar.closed) == ("tokenizing", rows, "prompt", True)
        assert sum(bar.updates) == rows and len(bar.updates) > 1
        assert [r.token_ids for r in records] == [r.token_ids for r in load_prompts(cfg, tok, path=path)]
        i = rows - 1   # the last row, tokenized on its own
        assert records[-1].token_ids == encode_messages([{"role": "user", "content": f"what is {i} plus {i % 7}?"}],
                                                        cfg, tok)[1]


def test_a_small_file_opens_no_bar(tmp_path, tiny_model_dir):
    RecordingBar.bars = []
    records = load_prompts(DataConfig(), load_tokenizer(tiny_model_dir), path=write_prompts(tmp_path / "p.parquet", 20),
                           progress=RecordingBar)
    assert len(records) == 20 and RecordingBar.bars == []
