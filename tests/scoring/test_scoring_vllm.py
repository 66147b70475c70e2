"""The vLLM scoring backend (prompt logprobs) against the torch backend on the tiny model.

vLLM runs in a fresh Python process with an in-process engine core
(VLLM_ENABLE_V1_MULTIPROCESSING=0, ~3 s per engine): vLLM 0.32's CPU build
cannot start an in-process engine once numba/llvmlite is imported, which
other tests in this session do (see ``vllm_backend.make_engine``). That
process writes the results as JSON; the comparisons run here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from support import requires_vllm
from pdsr_sdk.errors import ConfigError
from pdsr_sdk.scoring import per_token_logps

torch = pytest.importorskip("torch")

SCRIPT = textwrap.dedent('''
    import json, sys
    from pdsr_sdk.errors import DataError
    from pdsr_sdk.scoring import per_token_logps
    from pdsr_sdk.scoring.vllm_backend import make_engine, shutdown_engine

    def run(model, prompts, completions, **kw):
        r = per_token_logps(model, prompts, completions, backend="vllm", **kw)
        return {"logps": [x.tolist() for x in r.logps], "dtypes": sorted({str(x.dtype) for x in r.logps}),
                "stats": r.stats.to_dict()}

    def main(model_dir, samples_path, out_path):
        with open(samples_path) as fh:
            s = json.load(fh)
        prompts, completions = s["prompts"], s["completions"]
        out = {}
        llm = make_engine(model_dir, dtype="float32", max_model_len=256)
        try:
            out["fp32"] = run(llm, prompts, completions)
            out["fp32_mbs"] = run(llm, prompts, completions, mbs=6)
            out["fp32_quota"] = run(llm, prompts, completions, max_tokens_per_micro_batch=256)
            # a trainer's padded batch and its masks (padding -1: never read): the same rows
            P, R = max(map(len, prompts)), max(map(len, completions))
            padded_p = [[-1] * (P - len(p)) + p for p in prompts]
            padded_c = [c + [-1] * (R - len(c)) for c in completions]
            out["fp32_masked"] = run(llm, padded_p, padded_c, mbs=6,
                                     prompt_mask=[[x >= 0 for x in row] for row in padded_p],
                                     completion_mask=[[x >= 0 for x in row] for row in padded_c])
            # a failed sample has no completion tokens: [] (the others as above)
            out["empty"] = run(llm, prompts[:3], [completions[0], [], completions[2]])
            try:
                per_token_logps(llm, [[1] * 200], [[2] * 100], backend="vllm")
                out["too_long"] = None
            except DataError as exc:
                out["too_long"] = str(exc)
        finally:
            shutdown_engine(llm)
        # a model directory: the SDK starts and shuts down its own engine
        out["bf16"] = run(model_dir, prompts, completions, dtype="bfloat16", mbs=8)
        out["auto"] = run(model_dir, prompts, completions, mbs=8)   # the checkpoint's float32, not vLLM's bf16
        out["numba_imported"] = "numba" in sys.modules
        with open(out_path, "w") as fh:
            json.dump(out, fh)

    if __name__ == "__main__":
        main(*sys.argv[1:])
''')


@pytest.fixture(scope="module")
def samples():
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 1024, int(rng.integers(1, 40))).tolist() for _ in range(20)]
    completions = [rng.integers(0, 1024, int(rng.integers(1, 120))).tolist() for _ in range(20)]
    return prompts, completions


@pytest.fixture(scope="module")
def vllm_results(tiny_model_dir, samples, tmp_path_factory):
    work = tmp_path_factory.mktemp("vllm_score")
    script, sample_file, out = work / "score_vllm.py", work / "samples.json", work / "out.json"
    script.write_text(SCRIPT)
    sample_file.write_text(json.dumps({"prompts": samples[0], "completions": samples[1]}))
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(script), str(tiny_model_dir), str(sample_file), str(out)],
                          cwd=work, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"vLLM scoring process failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def torch_fp32(tiny_model_dir, samples):
    from pdsr_sdk.scoring.torch_backend import load_model

    return per_token_logps(load_model(tiny_model_dir, "cpu", "float32"), *samples).logps


def _diffs(a, b):
    """(max, mean) of |a - b| / max(1, |b|) over all tokens (shapes must match)."""
    assert [len(x) for x in a] == [len(y) for y in b]
    rel = np.concatenate([np.abs(np.asarray(x, np.float64) - y) / np.maximum(1.0, np.abs(y)) for x, y in zip(a, b)])
    return float(rel.max()), float(rel.mean())


@requires_vllm
@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("run", ["fp32", "fp32_mbs", "fp32_quota", "fp32_masked", "auto"])
def test_vllm_fp32_engine_matches_torch(vllm_results, torch_fp32, samples, run):
    res = vllm_results[run]
    assert res["dtypes"] == ["float32"]
    # the same fp32 function in different kernels: agreement at the torch-vs-naive level (1e-5)
    assert _diffs(res["logps"], torch_fp32)[0] <= 1e-5
    st = res["stats"]
    assert st["backend"] == "vllm" and st["distinct_shapes"] is None and st["padding_efficiency"] == 1.0
    assert st["real_tokens"] == sum(len(p) + len(c) for p, c in zip(*samples))
    if run != "fp32":
        assert st["micro_batches"] > 1  # several generate() calls, results in input order


@requires_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_empty_completion_gets_empty_list(vllm_results, torch_fp32):
    got = vllm_results["empty"]["logps"]
    assert got[1] == []
    assert _diffs([got[0], got[2]], [torch_fp32[0], torch_fp32[2]])[0] <= 1e-5


@requires_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_path_errors_and_imports(vllm_results):
    assert vllm_results["too_long"] is not None
    assert "does not fit the vLLM engine's max_model_len=256" in vllm_results["too_long"]
    assert vllm_results["numba_imported"] is False  # keeps in-process engines startable


@requires_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_bf16_within_bf16_tolerance(vllm_results, tiny_model_dir, samples, torch_fp32):
    """bf16 vLLM vs fp32 torch, with a tolerance derived from bf16 itself.

    vLLM-bf16 and transformers-bf16 evaluate the same bf16-rounded weights
    with bf16 activations; each differs from fp32 by rounding of the same kind
    and size, in different kernels. We measure transformers-bf16's deviation
    from fp32 on these very samples (unpadded, one sample at a time) and allow
    vLLM twice that, in the max and in the mean: a bf16 evaluation of the same
    function, no worse than a second independent bf16 implementation. A
    scoring bug (an off-by-one position, the wrong token) moves log-probs by
    O(1), far beyond; checked below with a one-token shift.
    """
    from pdsr_sdk.scoring.torch_backend import load_model

    model_bf16 = load_model(tiny_model_dir, "cpu", "bfloat16")
    naive_bf16 = []
    for p, c in zip(*samples):
        with torch.inference_mode():
            logits = model_bf16(torch.tensor([p + c])).logits.float()[0, len(p) - 1:-1]
        naive_bf16.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None])[:, 0].numpy())
    e_max, e_mean = _diffs(naive_bf16, torch_fp32)
    assert e_max > 0

    got = vllm_results["bf16"]["logps"]
    got_max, got_mean = _diffs(got, torch_fp32)
    assert got_max <= 2 * e_max, (got_max, e_max)
    assert got_mean <= 2 * e_mean, (got_mean, e_mean)
    shifted = [x[1:] for x in got if len(x) > 1]
    reference = [y[:-1] for y in torch_fp32 if len(y) > 1]
    assert _diffs(shifted, reference)[1] > 10 * 2 * e_mean


def test_vllm_rejects_temperature_and_entropy():
    # checked before vLLM is imported: no engine needed
    with pytest.raises(ConfigError, match="vLLM computes prompt logprobs from the raw logits"):
        per_token_logps("unused", [[1]], [[2]], backend="vllm", temperature=0.7)
    with pytest.raises(ConfigError, match="entropy: the vllm backend has no entropy"):
        per_token_logps("unused", [[1]], [[2]], backend="vllm", return_entropy=True)
