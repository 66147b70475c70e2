"""verl's generation dumps (``trainer.rollout_data_dir``: ``{step}.jsonl``, one line per response with the prompt's
and the response's text) into a length trace with ``pdsr trace convert --tokenizer``: each length is the tokenizer's
own count of the text, groups are a prompt text within a step, and bad input names the file, the line and the
flag."""

from __future__ import annotations

import json
import random

import pytest

from cli_checks import failed, invoke, write_jsonl

PROMPTS = ["user\nWhat is 7 + 5?\nassistant\n", "user\nSolve $x^2 = 49$ for the positive root.\nassistant\n"]


def _dump_rows(step: int, seed: int) -> list[dict]:
    """One step of verl's dump: both prompts, 4 responses each, shuffled (verl's balance_batch reorders a batch),
    with the reward function's extra keys after verl's own."""
    rng = random.Random(seed)
    rows = []
    for p, prompt in enumerate(PROMPTS):
        for k in range(4):
            words = rng.randint(1, 40)
            output = " ".join(rng.choice(["We", "get", "12", "so", "the", "answer", "is", "\\boxed{7}", "then"])
                              for _ in range(words))
            rows.append({"input": prompt, "output": output, "gts": "12" if p == 0 else "7",
                         "score": float(rng.random() < 0.5), "step": step, "acc": rng.random() < 0.5,
                         "pred": "[INVALID]"})
    rng.shuffle(rows)
    return rows


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture
def dump(tmp_path):
    """A folder of two steps, 2 and 10 (10 sorts first by name, after 2 by step), of the same two prompts."""
    folder = tmp_path / "rollout_data"
    folder.mkdir()
    steps = {step: _dump_rows(step, seed) for step, seed in ((2, 0), (10, 1))}
    for step, rows in steps.items():
        write_jsonl(folder / f"{step}.jsonl", rows)
    return folder, steps


def _expected(steps: dict[int, list[dict]], tokenizer, reward_key: str = "score") -> list[dict]:
    """The trace written by hand: per step (in step order), a group per prompt text in order of its first line, its
    samples (length, reward) sorted, as the reader puts them in a random order; lengths by the tokenizer's encode of
    each text, one at a time."""
    def count(text):
        return len(tokenizer.encode(text, add_special_tokens=False))

    out = []
    for step in sorted(steps):
        groups: dict[str, dict] = {}
        for line, row in enumerate(steps[step], 1):
            group = groups.setdefault(row["input"], {"prompt_id": f"{step}.jsonl:{line}",
                                                     "prompt_len": count(row["input"]), "lengths": [],
                                                     "rewards": []})
            group["lengths"].append(count(row["output"]))
            group["rewards"].append(float(row[reward_key]))
        out.extend(groups.values())
    return _sorted_samples(out)


def _sorted_samples(groups: list[dict]) -> list[dict]:
    """Trace lines with each group's samples sorted by (length, reward), kept paired."""
    out = []
    for g in groups:
        pairs = sorted(zip(g["lengths"], g["rewards"]))
        out.append({**g, "lengths": [n for n, _ in pairs], "rewards": [r for _, r in pairs]})
    return out


def _read(path) -> list[dict]:
    return _sorted_samples([json.loads(line) for line in path.read_text().splitlines()])


def test_a_folder_of_steps_gives_a_group_per_prompt_text_and_step_counted_by_the_tokenizer(dump, tokenizer,
                                                                                            tiny_model_dir, tmp_path):
    folder, steps = dump
    out = tmp_path / "trace.jsonl"
    result = invoke("trace", "convert", folder, "--tokenizer", tiny_model_dir, "--out", out)
    assert result.exit_code == 0, result.output
    got = _read(out)
    assert got == _expected(steps, tokenizer)
    # the same prompt text in two steps is two groups, and the lengths are not all alike (the check can fail)
    assert len(got) == 4 and len({g["prompt_len"] for g in got}) == 2
    assert len({n for g in got for n in g["lengths"]}) > 4
    assert "4 groups, 4 samples each, 16 samples (with rewards)" in result.output

    analysis = tmp_path / "analysis"
    result = invoke("analyze", out, "--out-dir", analysis)
    assert result.exit_code == 0, result.output
    summary = json.loads((analysis / "analysis.json").read_text())["trace"]
    assert (summary["groups"], summary["samples"]) == (4, 16)
    assert summary["tokens"] == sum(n for g in got for n in g["lengths"])


def test_one_step_file_a_pattern_and_another_reward_key(dump, tokenizer, tiny_model_dir, tmp_path):
    folder, steps = dump
    one = tmp_path / "one.jsonl"
    assert invoke("trace", "convert", folder / "10.jsonl", "--tokenizer", tiny_model_dir, "--out", one).exit_code == 0
    assert _read(one) == _expected({10: steps[10]}, tokenizer)

    acc = tmp_path / "acc.jsonl"
    result = invoke("trace", "convert", f"{folder}/*.jsonl", "--tokenizer", tiny_model_dir, "--reward-column", "acc",
                    "--out", acc)
    assert result.exit_code == 0, result.output
    assert _read(acc) == _expected(steps, tokenizer, reward_key="acc")


def test_the_sdk_reads_a_dump_with_a_tokenizer_object(dump, tokenizer):
    from pdsr_sdk.traces import read_any_trace, read_verl_dump

    folder, steps = dump
    expected = _expected(steps, tokenizer)
    for trace in (read_verl_dump(folder, tokenizer), read_any_trace(folder, tokenizer=tokenizer)):
        assert trace.prompt_ids == [g["prompt_id"] for g in expected]
        assert sorted(map(sorted, trace.matrix().tolist())) == sorted(g["lengths"] for g in expected)
        assert trace.prompt_lens.tolist() == [g["prompt_len"] for g in expected]


def _balance_batch_order(seqlens: list[int]) -> list[int]:
    """The order verl's _balance_batch writes a batch in on one data-parallel rank (verl b178a3c,
    verl/trainer/ppo/ray_trainer.py: the partition sorted by workload, then its even places ascending and its odd
    places descending), the workload 24576 s + s^2 of each sequence's tokens s."""
    part = sorted(range(len(seqlens)), key=lambda i: (24576 * seqlens[i] + seqlens[i] ** 2, i))
    return part[::2] + part[1::2][::-1]


def test_the_probe_of_a_balance_batch_dump_is_a_random_sample_not_the_short_first_line(tokenizer, tmp_path):
    """verl's balance_batch writes each rank's lines shortest first: the first line of a group was its shortest in
    about half the groups. The probe must be any of a group's samples alike (the shortest in 1/N of the groups),
    and the same dump must give the same trace."""
    from pdsr_sdk.traces import read_verl_dump

    rng = random.Random(3)
    groups, n = 200, 8
    rows = []
    for g in range(groups):
        prompt = f"user\nQuestion {g}: add {g} and {g + 1}.\nassistant\n"
        for words in rng.sample(range(1, 120), n):    # distinct lengths within a group
            rows.append({"input": prompt, "output": " ".join(["step"] * words), "gts": "1", "score": words / 100,
                         "step": 1})
    count = [len(tokenizer.encode(r["input"] + r["output"], add_special_tokens=False)) for r in rows]
    dump = tmp_path / "1.jsonl"
    write_jsonl(dump, [rows[i] for i in _balance_batch_order(count)])

    trace = read_verl_dump(dump, tokenizer)
    x = trace.matrix()
    assert trace.num_groups == groups and len({tuple(r) for r in x.tolist()}) == groups
    shortest = float((x[:, 0] == x.min(axis=1)).mean())
    # first lines: the shortest in ~50% of groups; a random sample: 1/8 (sd 2.3% over 200 groups)
    assert 0.05 < shortest < 0.22, shortest
    # rewards stay with their responses: each score here is the response's word count / 100
    words = (trace.rewards.reshape(groups, n) * 100).round().astype(int)
    assert (x == [[len(tokenizer.encode(" ".join(["step"] * w), add_special_tokens=False)) for w in row]
                  for row in words.tolist()]).all()
    again = read_verl_dump(dump, tokenizer)
    assert again.lengths.tolist() == trace.lengths.tolist() and again.prompt_ids == trace.prompt_ids


def test_bad_dumps_name_the_file_the_line_and_the_flag(dump, tiny_model_dir, tmp_path):
    folder, steps = dump
    out = tmp_path / "trace.jsonl"
    failed(invoke("trace", "convert", folder, "--out", out), str(folder / "2.jsonl"), "--tokenizer DIR")
    failed(invoke("trace", "convert", folder, "--tokenizer", tmp_path / "nowhere", "--out", out),
           "--tokenizer", "nowhere", "does not exist")

    rows = steps[10]
    del rows[5]["output"]
    write_jsonl(folder / "10.jsonl", rows)
    failed(invoke("trace", "convert", folder, "--tokenizer", tiny_model_dir, "--out", out),
           f"{folder / '10.jsonl'}:6", "'output'", "response text")
    rows[5]["output"] = "fine"
    rows[2]["score"] = "high"
    write_jsonl(folder / "10.jsonl", rows)
    failed(invoke("trace", "convert", folder, "--tokenizer", tiny_model_dir, "--out", out),
           f"{folder / '10.jsonl'}:3", "'score'", "'high'")
    failed(invoke("trace", "convert", folder, "--tokenizer", tiny_model_dir, "--reward-column", "accuracy",
                  "--out", out), f"{folder / '2.jsonl'}:1", "'accuracy'", "--reward-column")

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a dump\n")
    failed(invoke("trace", "convert", empty, "--tokenizer", tiny_model_dir, "--out", out), str(empty), "found none")
    assert not out.exists()


def test_a_dump_read_as_a_trace_points_to_convert(dump):
    folder, _ = dump
    failed(invoke("analyze", folder / "2.jsonl", "--out-dir", folder / "analysis"), "verl", "trace convert",
           "--tokenizer")

