"""The CPU build's dtype rule (issue 47, item 5): ``auto`` is bf16 where the CPU computes in bf16
natively (flags avx512_bf16 or amx_bf16), fp32 otherwise; an explicit dtype wins. No vLLM needed."""

from __future__ import annotations

import pytest

from pdsr_sdk.engines import vllm_env
from pdsr_sdk.engines.vllm_env import cpu_dtype, cpu_flags
from pdsr_sdk.rollout.config import EngineSpec


def cpuinfo(flags: str) -> str:
    """Two processors of /proc/cpuinfo with the given flags (the shape of the real file)."""
    one = ("processor\t: {n}\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n"
           "flags\t\t: {flags}\nbugs\t\t: sysret_ss_attrs\n\n")
    return one.format(n=0, flags=flags) + one.format(n=1, flags=flags)


BASE = "fpu vme sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi1 bmi2"
AVX2_ONLY = BASE                                                     # the AMD EPYC of ENV.md (13 vs 47-55 tokens/s)
AVX512_NO_BF16 = BASE + " avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni"
AVX512_BF16 = AVX512_NO_BF16 + " avx512_bf16 avx512_fp16"            # this machine also has amx_bf16
AMX_ONLY = BASE + " avx512f amx_bf16 amx_tile amx_int8"


@pytest.mark.parametrize("flags, dtype", [
    (AVX2_ONLY, "float32"),
    (AVX512_NO_BF16, "float32"),
    (AVX512_BF16, "bfloat16"),
    (AVX512_BF16 + " amx_bf16 amx_tile amx_int8", "bfloat16"),
    (AMX_ONLY, "bfloat16"),
    ("", "float32"),
])
def test_auto_picks_bf16_only_with_native_bf16(flags, dtype):
    assert cpu_dtype("auto", cpuinfo(flags)) == dtype


def test_no_flags_line_means_fp32():
    assert cpu_flags("processor\t: 0\nFeatures\t: fp asimd bf16\n") == frozenset()   # not x86: no rule for it
    assert cpu_dtype("auto", "") == "float32"


@pytest.mark.parametrize("explicit", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("flags", [AVX2_ONLY, AVX512_BF16])
def test_an_explicit_dtype_wins(explicit, flags):
    assert cpu_dtype(explicit, cpuinfo(flags)) == explicit


def test_flags_are_whole_words():
    """``avx512_bf16`` must be a flag of its own, not a part of another one."""
    assert cpu_dtype("auto", cpuinfo(BASE + " xavx512_bf16x")) == "float32"
    assert "avx2" in cpu_flags(cpuinfo(AVX2_ONLY))


def _engine_args(monkeypatch, flags: str, cpu: bool = True, **spec):
    from pdsr_sdk.engines.vllm_engine import VllmEngine

    monkeypatch.setattr(vllm_env, "cpu_flags", lambda text=None: cpu_flags(cpuinfo(flags)))
    engine = VllmEngine(EngineSpec(name="e", pool="fast", **spec), model="/nonexistent")
    try:
        return engine._engine_args(cpu)
    finally:
        engine._error_file.unlink(missing_ok=True)


def test_the_engine_uses_the_rule_and_an_explicit_dtype_wins(monkeypatch):
    assert EngineSpec(name="e", pool="fast").dtype == "auto"
    assert _engine_args(monkeypatch, AVX2_ONLY)["dtype"] == "float32"
    assert _engine_args(monkeypatch, AVX512_BF16)["dtype"] == "bfloat16"
    assert _engine_args(monkeypatch, AVX2_ONLY, dtype="bfloat16")["dtype"] == "bfloat16"
    assert _engine_args(monkeypatch, AVX512_BF16, dtype="float32")["dtype"] == "float32"
    assert _engine_args(monkeypatch, AVX2_ONLY, engine_args={"dtype": "bfloat16"})["dtype"] == "bfloat16"
    assert _engine_args(monkeypatch, AVX2_ONLY, cpu=False)["dtype"] == "auto"      # GPUs: vLLM's own choice
