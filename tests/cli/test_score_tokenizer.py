"""``pdsr score`` refuses a rollout file whose ids another tokenizer made: they are all in the vocabulary, so only
decoding them against the file's ``response_text`` tells (pdsr_sdk.scoring.tokenizer_check)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

pytest.importorskip("transformers")

from pdsr_cli.main import cli  # noqa: E402

TEXTS = ["The answer is 42.", "Let x = 3, then 2x + 1 = 7.", "", "Paris is the capital of France.", "yes"]


@pytest.fixture()
def rollout(tmp_path, tiny_model_dir):
    """A file as pdsr rollout writes it: ids from the tiny model's tokenizer and their text (row 2 failed)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))

    def write(name, recode=lambda ids: ids, texts=TEXTS):
        responses = [recode(tok.encode(t, add_special_tokens=False)) for t in texts]
        prompts = [tok.encode("Q: ", add_special_tokens=False)] * len(texts)
        path = tmp_path / name
        pq.write_table(pa.table({"prompt_token_ids": prompts, "response_token_ids": responses,
                                 "response_text": texts}), path)
        return path, responses

    return write


def score(tiny_model_dir, data, out):
    return CliRunner().invoke(cli, ["score", "--model", str(tiny_model_dir), "--data", str(data), "--out", str(out),
                                    "--device", "cpu", "--quiet"])


def test_ids_of_the_models_tokenizer_score(tmp_path, tiny_model_dir, rollout):
    data, responses = rollout("ok.parquet")
    res = score(tiny_model_dir, data, tmp_path / "o.parquet")
    assert res.exit_code == 0, res.output
    assert [len(r) for r in pq.read_table(tmp_path / "o.parquet").column("ref_logps").to_pylist()] == \
        [len(r) for r in responses]


def test_ids_of_another_tokenizer_are_refused_naming_a_row(tmp_path, tiny_model_dir, rollout):
    # another tokenizer's ids for the same text: in the vocabulary, other tokens
    data, _ = rollout("other.parquet", recode=lambda ids: [(7 * i + 3) % 1000 for i in ids])
    res = score(tiny_model_dir, data, tmp_path / "o.parquet")
    assert res.exit_code == 2 and res.output.startswith(f"error: {data}: row 0: response_token_ids decode with the "
                                                        f"tokenizer of {tiny_model_dir} to "), res.output
    assert "but its response_text is 'The answer is 42.'" in res.output and "(and so for the 4 row(s)" in res.output
    assert "another tokenizer" in res.output and not (tmp_path / "o.parquet").exists()

    # one row that decodes to its text is enough (a tokenizer whose decode differs only now and then)
    table = pq.read_table(data)
    good = pq.read_table(rollout("ok.parquet")[0])
    mixed = table.set_column(1, "response_token_ids",
                             pa.array(table.column(1).to_pylist()[:4] + good.column(1).to_pylist()[4:]))
    pq.write_table(mixed, data)
    assert score(tiny_model_dir, data, tmp_path / "o.parquet").exit_code == 0
