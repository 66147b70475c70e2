"""slime's rollout dumps (``--save-debug-rollout-data PATH_TEMPLATE``: one ``torch.save`` file per rollout) into a
length trace: ``pdsr analyze FILE``, ``pdsr trace convert FOLDER`` and ``read_trace``. Groups are slime's
``group_index`` (consecutive samples of one prompt where there is none), lengths slime's exact token counts, finish
reasons its ``status``; bad input names the file, the sample and the key."""

from __future__ import annotations

import json
import random
import sys
import zipfile

import pytest

from cli_checks import failed, invoke
from pdsr_sdk.errors import DataError
from pdsr_sdk.traces import read_any_trace, read_slime_dump, read_trace
from pdsr_sdk.traces.torch_file import TensorShape, load_torch_file

torch = pytest.importorskip("torch")   # builds the files as slime does; reading them needs no torch

CAP = 64
STATUS = {"completed": "stop", "truncated": "length", "failed": "failed", "aborted": "abort"}   # written by hand


def slime_sample(*, group_index, index, prompt, prompt_tokens, response_length, status="completed", reward=1.0,
                 **changes) -> dict:
    """One sample as slime's ``Sample.to_dict()`` gives it (THUDM/slime 624b824, slime/utils/types.py: the
    dataclass's ``__dict__``, every field, ``status`` as its value, ``spec_info`` and ``prefix_cache_info`` as dicts;
    ``trace`` is the attribute slime/observability/trace_utils.py's ``bind_trace`` sets on it)."""
    sample = {
        "group_index": group_index, "index": index, "rollout_id": None, "prompt": prompt,
        # the prompt's ids, then the response's
        "tokens": list(range(100, 100 + prompt_tokens)) + [7] * response_length,
        "multimodal_inputs": None, "multimodal_train_inputs": None, "multimodal_train_input_id": None,
        "apply_chat_template_kwargs": {}, "response": "so " * response_length, "response_length": response_length,
        "label": "12", "reward": reward, "loss_mask": None, "weight_versions": ["3"],
        "rollout_log_probs": [-0.25] * response_length, "rollout_top_p_token_ids": None,
        "rollout_top_p_token_offsets": None, "rollout_routed_experts": None, "remove_sample": False,
        "teacher_log_probs": None, "status": status, "metadata": {"start_rollout_id": 2},
        "generate_function_path": None, "custom_rm_path": None, "train_metadata": None, "session_id": None,
        "non_generation_time": 0.0,
        "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0, "spec_verify_ct": 0,
                      "completion_token_num": 0},
        "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": prompt_tokens},
        "trace": {"version": 1, "trace_id": f"t{index}", "events": [], "sample_id": index, "group_id": group_index,
                  "attempt": 0},
    }
    sample.update(changes)
    return sample


def save_rollout(path, rollout_id, samples):
    """As slime/observability/rollout_data_utils.py's ``save_debug_rollout_data`` at 624b824."""
    torch.save({"rollout_id": rollout_id, "samples": samples}, path)
    return path


def rollout(rollout_id: int, first_group: int, seed: int, groups: int = 3, n: int = 4):
    """A rollout's samples (its groups one after another, as slime flattens them) and, written beside them, the
    trace expected: per group (prompt length, lengths, finish reasons, rewards)."""
    rng = random.Random(seed)
    samples, expected = [], []
    for g in range(groups):
        prompt_tokens = rng.randint(5, 40)
        lengths = [rng.choice([CAP, rng.randint(1, CAP - 1)]) for _ in range(n)]
        statuses = ["truncated" if x == CAP else "completed" for x in lengths]
        rewards = [float(rng.random() < 0.5) for _ in range(n)]
        for k in range(n):
            samples.append(slime_sample(group_index=first_group + g, index=(first_group + g) * n + k,
                                        prompt=f"Question {first_group + g}?", prompt_tokens=prompt_tokens,
                                        response_length=lengths[k], status=statuses[k], reward=rewards[k]))
        expected.append((prompt_tokens, lengths, [STATUS[s] for s in statuses], rewards))
    return samples, expected


def check(trace, expected):
    assert trace.num_groups == len(expected)
    for g, (prompt_len, lengths, reasons, rewards) in enumerate(expected):
        lo, hi = trace.offsets[g], trace.offsets[g + 1]
        assert int(trace.prompt_lens[g]) == prompt_len
        assert trace.lengths[lo:hi].tolist() == lengths
        assert trace.finish_reasons[lo:hi].tolist() == reasons
        assert trace.rewards[lo:hi].tolist() == rewards


@pytest.fixture
def run_dir(tmp_path):
    """slime's rollout_data folder of two rollouts, 2 and 10 (``rollout_10.pt`` sorts first by name), and an
    evaluation dump of rollout 10 beside them."""
    folder = tmp_path / "rollout_data"
    folder.mkdir()
    two, want_two = rollout(2, first_group=8, seed=0)
    ten, want_ten = rollout(10, first_group=40, seed=1)
    save_rollout(folder / "rollout_2.pt", 2, two)
    save_rollout(folder / "rollout_10.pt", 10, ten)
    evaluation, _ = rollout(10, first_group=0, seed=2, groups=1)
    save_rollout(folder / "rollout_eval_10.pt", 10, [dict(s, group_index=None) for s in evaluation])
    return folder, want_two, want_ten


def test_one_rollout_file_is_read_as_slime_wrote_it(run_dir):
    folder, want_two, _ = run_dir
    trace = read_trace(folder / "rollout_2.pt")
    check(trace, want_two)
    assert trace.prompt_ids == ["rollout_2.pt:g8", "rollout_2.pt:g9", "rollout_2.pt:g10"]
    # what slime saved loads under torch's safe loader, and what it holds is what was read
    saved = torch.load(folder / "rollout_2.pt", weights_only=True)
    assert [s["response_length"] for s in saved["samples"]] == [x for _, ls, _, _ in want_two for x in ls]


def test_a_folder_or_pattern_is_one_trace_in_rollout_order_without_the_evaluations(run_dir, tmp_path):
    folder, want_two, want_ten = run_dir
    for source in (folder, folder / "rollout_*.pt"):
        trace = read_any_trace(source)
        check(trace, want_two + want_ten)
        assert trace.prompt_ids[3] == "rollout_10.pt:g40"
        assert read_slime_dump(source).prompt_ids == trace.prompt_ids
    out = tmp_path / "trace.jsonl"
    result = invoke("trace", "convert", folder, "--out", out)
    assert "6 groups, 4 samples each, 24 samples" in result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(x["prompt_len"], x["lengths"], x["finish_reasons"], x["rewards"]) for x in lines] == \
        [(p, ls, rs, ws) for p, ls, rs, ws in want_two + want_ten]


def test_pdsr_analyze_reads_a_rollout_file(run_dir, tmp_path):
    folder, _, want_ten = run_dir
    result = invoke("analyze", folder / "rollout_10.pt", "--no-plots", "--out-dir", tmp_path / "o")
    assert result.exit_code == 0, result.output
    assert "3 groups x 4 samples" in result.output
    report = json.loads((tmp_path / "o" / "analysis.json").read_text())["trace"]
    assert report["samples"] == 12 and report["groups"] == 3
    reasons = [r for _, _, rs, _ in want_ten for r in rs]
    assert report["finish_reasons"] == {r: reasons.count(r) for r in set(reasons)}
    assert report["prompt_length"]["max"] == max(p for p, _, _, _ in want_ten)


def test_an_evaluation_dump_groups_consecutive_samples_of_one_prompt(tmp_path):
    # slime's eval writes no group_index: each prompt's n samples in a row (sorted by index), datasets one after another
    rows = [("What is 1+1?", 3), ("What is 1+1?", 9), ("Name a prime.", 4), ("Name a prime.", 2),
            ("What is 1+1?", 5), ("What is 1+1?", 6)]   # the first prompt again: another dataset's, another group
    samples = [slime_sample(group_index=None, index=i, prompt=p, prompt_tokens=10 + len(p), response_length=x)
               for i, (p, x) in enumerate(rows)]
    trace = read_trace(save_rollout(tmp_path / "eval_7.pt", 7, samples))
    assert trace.prompt_ids == ["eval_7.pt:0", "eval_7.pt:2", "eval_7.pt:4"]
    assert trace.lengths.tolist() == [3, 9, 4, 2, 5, 6] and trace.offsets.tolist() == [0, 2, 4, 6]
    assert trace.prompt_lens.tolist() == [22, 23, 22]


def test_group_index_groups_samples_wherever_they_are(tmp_path):
    # a custom rollout function may return a group's samples apart; sample 0 is the group's first in the file
    samples = [slime_sample(group_index=g, index=i, prompt=f"q{g}", prompt_tokens=g - 3, response_length=10 * i + 1)
               for i, g in enumerate([5, 6, 5, 6, 5, 6])]
    trace = read_trace(save_rollout(tmp_path / "0.pt", 0, samples))
    assert trace.prompt_ids == ["0.pt:g5", "0.pt:g6"]
    assert trace.lengths.tolist() == [1, 21, 41, 11, 31, 51] and trace.prompt_lens.tolist() == [2, 3]


def test_tensors_are_counted_by_shape_and_torch_types_are_read_by_torch(tmp_path):
    plain = [slime_sample(group_index=0, index=k, prompt="q", prompt_tokens=6, response_length=3 + k) for k in range(2)]
    for s in plain:   # what slime's engine replay keeps as tensors; tokens a tensor too
        s["tokens"] = torch.tensor(s["tokens"])
        s["rollout_top_p_token_ids"] = torch.arange(4, dtype=torch.int32)
        s["rollout_routed_experts"] = torch.zeros((s["response_length"], 2, 2), dtype=torch.int32)
    fast = read_trace(save_rollout(tmp_path / "1.pt", 1, plain))
    plain[1]["metadata"] = {"device": torch.device("cpu"), "dtype": torch.bfloat16}   # allowed by torch's safe loader
    slow = read_trace(save_rollout(tmp_path / "2.pt", 2, plain))
    for trace in (fast, slow):
        assert trace.lengths.tolist() == [3, 4] and trace.prompt_lens.tolist() == [6]
    # the first read no tensor's values, the second was torch.load(weights_only=True)'s
    assert isinstance(load_torch_file(tmp_path / "1.pt")["samples"][0]["tokens"], TensorShape)
    assert isinstance(load_torch_file(tmp_path / "2.pt")["samples"][0]["tokens"], torch.Tensor)


def test_reading_needs_no_torch_unless_the_file_names_its_types(tmp_path, monkeypatch):
    samples = [_sample(tokens=torch.arange(9), rollout_routed_experts=torch.zeros((5, 2, 2)))]
    plain = save_rollout(tmp_path / "1.pt", 1, samples)
    device = save_rollout(tmp_path / "2.pt", 2, [dict(samples[0], metadata={"device": torch.device("cpu")})])
    monkeypatch.setitem(sys.modules, "torch", None)   # `import torch` fails
    trace = read_trace(plain)
    assert trace.lengths.tolist() == [5] and trace.prompt_lens.tolist() == [4]
    with pytest.raises(DataError, match=r"2\.pt: holds torch\.device, which only torch reads; install torch"):
        read_trace(device)


def test_dict_rewards_read_score_or_the_key_named(tmp_path):
    samples = [slime_sample(group_index=0, index=k, prompt="q", prompt_tokens=4, response_length=5,
                            reward={"score": 0.5 * k, "acc": k == 1}) for k in range(2)]
    samples.append(slime_sample(group_index=0, index=2, prompt="q", prompt_tokens=4, response_length=5, reward=None))
    path = save_rollout(tmp_path / "3.pt", 3, samples)
    assert read_trace(path).rewards.tolist()[:2] == [0.0, 0.5]
    trace = read_any_trace(path, reward_column="acc")
    assert trace.rewards.tolist()[:2] == [0.0, 1.0] and str(trace.rewards[2]) == "nan"
    with pytest.raises(DataError, match=r"3\.pt: samples\[0\]: 'reward' is a dict without 'gold' \(keys: 'score', "
                                        r"'acc'\)"):
        read_any_trace(path, reward_column="gold")
    del samples[0]["reward"]["score"]
    with pytest.raises(DataError, match=r"samples\[0\]: 'reward' is a dict without 'score'.*--reward-column KEY"):
        read_trace(save_rollout(tmp_path / "4.pt", 4, samples))
    numbers = save_rollout(tmp_path / "5.pt", 5, [slime_sample(group_index=0, index=0, prompt="q", prompt_tokens=1,
                                                                response_length=1, reward=1.0)])
    with pytest.raises(DataError, match=r"samples\[0\]: 'reward' is 1\.0, not a dict: no key 'acc'"):
        read_any_trace(numbers, reward_column="acc")


def _sample(**changes):
    sample = slime_sample(group_index=0, index=0, prompt="q", prompt_tokens=4, response_length=5)
    sample.update(changes)
    return sample


def _without(key):
    s = _sample()
    del s[key]
    return s


def test_a_multi_turn_sample_has_the_turns_of_its_loss_mask(tmp_path):
    # slime's multi-turn samples: the response holds the tools' tokens (loss_mask 0) between the model's turns
    mask = [1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1]
    samples = [slime_sample(group_index=0, index=0, prompt="q", prompt_tokens=4, response_length=11, loss_mask=mask,
                            non_generation_time=3.0),
               slime_sample(group_index=0, index=1, prompt="q", prompt_tokens=4, response_length=6,
                            loss_mask=[1, 1, 0, 1, 0, 0], non_generation_time=0.5),
               slime_sample(group_index=0, index=2, prompt="q", prompt_tokens=4, response_length=3, loss_mask=[1] * 3),
               slime_sample(group_index=0, index=3, prompt="q", prompt_tokens=4, response_length=2)]
    path = save_rollout(tmp_path / "1.pt", 1, samples)
    trace = read_trace(path)
    assert trace.multi_turn and trace.lengths.tolist() == [11, 6, 3, 2]
    # the tools' seconds shared by the turns they answered; the last turn's trailing 0s are what the tools added
    assert trace.turns.of(0) == [(3, 2, 1.5), (2, 3, 1.5), (1, 0, 0.0)]
    assert trace.turns.of(1) == [(2, 1, 0.25), (1, 2, 0.25)]
    assert trace.turns.of(2) is None and trace.turns.of(3) is None   # all sampled, or no mask: single-turn
    out = tmp_path / "t.jsonl"   # and they survive a conversion to pdsr's own trace
    invoke("trace", "convert", path, "--out", out)
    assert read_trace(out).turns.of(0) == [(3, 2, 1.5), (2, 3, 1.5), (1, 0, 0.0)]
    single = read_trace(save_rollout(tmp_path / "2.pt", 2, samples[2:]))
    assert single.turns is None and not single.multi_turn


@pytest.mark.parametrize("content, needle", [
    ([_sample()], "holds list, not a dict; slime's --save-debug-rollout-data writes"),
    ({"rollout_id": 1, "data": []}, "no 'samples' key (keys: 'rollout_id', 'data')"),
    ({"rollout_id": 1, "samples": {"a": 1}}, "'samples' is dict, not a list"),
    ({"rollout_id": 1, "samples": []}, "'samples' is empty"),
    ({"samples": [_sample(), "text"]}, "samples[1] is 'text', not a dict (Sample.to_dict())"),
    ({"samples": [_sample(), _without("response_length")]}, "samples[1]: no 'response_length'"),
    ({"samples": [_sample(response_length=-3)]}, "samples[0]: 'response_length' is -3; a token count is >= 0"),
    ({"samples": [_sample(response_length=2.5)]}, "samples[0]: 'response_length' is 2.5; expected a whole number"),
    ({"samples": [_sample(tokens=[1, 2])]}, "samples[0]: 'tokens' holds 2 token ids, fewer than 'response_length' 5"),
    ({"samples": [_sample(), _without("tokens")]}, "samples[1]: no 'tokens'"),
    ({"samples": [_sample(status="done")]}, "samples[0]: 'status' is 'done'; expected one of slime's Sample.Status"),
    ({"samples": [_sample(reward="1")]}, "samples[0]: 'reward' is '1'; expected a finite number"),
    ({"samples": [_sample(reward=float("inf"))]}, "samples[0]: 'reward' is inf; expected a finite number"),
    ({"samples": [_without("reward")]}, "samples[0]: no 'reward'"),
    ({"samples": [_sample(loss_mask=[1, 1, 0])]}, "samples[0]: 'loss_mask' has 3 entries, not one per response token"),
    ({"samples": [_sample(loss_mask=[1, 2, 0, 1, 1])]}, "samples[0]: 'loss_mask' is [1, 2, 0, 1, 1]; expected a list"),
    ({"samples": [_sample(loss_mask=[0, 1, 1, 1, 1])]}, "samples[0]: 'loss_mask' starts with 0"),
    ({"samples": [_sample(loss_mask=[1, 0, 1, 1, 1], non_generation_time=-1.0)]},
     "samples[0]: 'non_generation_time' is -1.0; expected seconds"),
    ({"samples": [_sample(group_index=None), dict(_without("prompt"), group_index=None)]},
     "samples[1]: no 'group_index' nor 'prompt' to group it by"),
])
def test_bad_dumps_name_the_file_the_sample_and_the_key(tmp_path, content, needle):
    path = tmp_path / "9.pt"
    torch.save(content, path)
    with pytest.raises(DataError) as err:
        read_trace(path)
    assert str(err.value).startswith(f"{path}: ") and needle in str(err.value), str(err.value)
    failed(invoke("analyze", path, "--no-plots", "--out-dir", tmp_path / "o"), f"TRACE {path}: ", needle)


def test_files_not_read_say_why(tmp_path):
    import numpy as np

    arrays = tmp_path / "arrays.pt"
    torch.save({"samples": [_sample(metadata={"scores": np.zeros(3)})]}, arrays)
    with pytest.raises(DataError, match=r"arrays\.pt: holds numpy\.\S+, which is not read: only tensors"):
        read_trace(arrays)
    other_zip = tmp_path / "other.pt"
    with zipfile.ZipFile(other_zip, "w") as z:
        z.writestr("readme.txt", "hello")
    with pytest.raises(DataError, match=r"other\.pt: a zip archive without data\.pkl, not a torch\.save file"):
        read_trace(other_zip)
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"PK\x03\x04" + b"\x00" * 40)
    with pytest.raises(DataError, match=r"broken\.pt: not a torch\.save file \(a zip archive\)"):
        read_trace(broken)


def test_columns_of_a_table_are_refused_for_a_dump(run_dir, tmp_path):
    folder, _, _ = run_dir
    failed(invoke("trace", "convert", folder, "--id-column", "index", "--out", tmp_path / "t.jsonl"),
           "slime's rollout dump (torch.save) has its own keys; --id-column name columns of a table")
