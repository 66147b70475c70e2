"""Dictionary-encoded columns (what pandas writes for a categorical: ``data_source``, an answer, even the prompt)
are read as their values, the same prompts as from plain columns."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from pdsr_sdk.rollout.config import DataConfig
from pdsr_sdk.rollout.data import load_prompts, load_tokenizer


def test_dictionary_columns_read_as_their_values(tmp_path, tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    columns = {"id": ["a", "b", "c"], "prompt": ["What is 1+1?", "What is 2+2?", "What is 1+1?"],
               "answer": ["2", "4", "2"], "data_source": ["openai/gsm8k"] * 3}
    plain, coded = tmp_path / "plain.parquet", tmp_path / "coded.parquet"
    pq.write_table(pa.table(columns), plain)
    table = pa.table({k: pa.array(v).dictionary_encode() if k != "id" else v for k, v in columns.items()})
    pq.write_table(table, coded)
    assert pa.types.is_dictionary(pq.read_table(coded).schema.field("answer").type)   # the premise: read back coded

    def read(path):
        return [(r.prompt_id, r.text, r.token_ids, r.ground_truth, r.reward_info)
                for r in load_prompts(DataConfig(), tok, path=path)]

    want = read(plain)
    assert [w[3] for w in want] == ["2", "4", "2"] and want[0][4] == {"data_source": "openai/gsm8k"}
    assert read(coded) == want
