"""The built-in sample prompts: small math word problems the project writes itself.

Deterministic, so the committed copy in ``examples/sample_prompts.jsonl`` can
be checked against this generator. Difficulty varies on purpose (one-step
arithmetic up to multi-step problems that invite long answers), so a real
model gives a real spread of response lengths.
"""

from __future__ import annotations

import json
from pathlib import Path

from pdsr_sdk.io.tables import write_text_atomic

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def sample_prompts(count: int = 64) -> list[dict]:
    """``count`` prompts with ``id``, ``prompt`` and ``answer`` (and a difficulty ``level``)."""
    rows = []
    for i in range(count):
        a, b, c = 3 + (i * 7) % 41, 2 + (i * 11) % 23, 2 + (i * 5) % 9
        kind = i % 8
        if kind == 0:
            q, ans, level = f"What is {a} + {b}?", a + b, 1
        elif kind == 1:
            q, ans, level = f"What is {a} times {c}?", a * c, 1
        elif kind == 2:
            q, ans, level = (f"A shop sells pencils for {c} dollars each. Sam buys {b} pencils and pays with a "
                             f"{c * b + a} dollar bill. How much change does he get?", a, 2)
        elif kind == 3:
            q, ans, level = f"Solve for x: {c}x + {a} = {c * b + a}.", b, 2
        elif kind == 4:
            q, ans, level = f"What is the sum of the first {b} positive integers?", b * (b + 1) // 2, 3
        elif kind == 5:
            n = 10 + (i % 6) * 5
            primes = [p for p in range(2, n + 1) if all(p % d for d in range(2, int(p ** 0.5) + 1))]
            q, ans, level = f"How many prime numbers are less than or equal to {n}? List them first.", len(primes), 3
        elif kind == 6:
            q, ans, level = (f"A train travels {a * c} km in {c} hours, then {b * c} km in {c} hours. "
                             f"What is its average speed in km/h over the whole trip?",
                             _fmt((a * c + b * c) / (2 * c)), 4)
        else:
            q, ans, level = (f"The sequence starts {a}, {a + c}, {a + 2 * c}, ... What is the sum of its "
                             f"first {b} terms? Show each step.", b * a + c * b * (b - 1) // 2, 5)
        rows.append({"id": f"sample-{i:03d}", "prompt": f"{q} {INSTRUCTION}", "answer": str(ans), "level": level})
    return rows


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def write_sample_prompts(path: str | Path, count: int = 64) -> Path:
    """Write the sample prompts as JSONL (atomically)."""
    text = "".join(json.dumps(r) + "\n" for r in sample_prompts(count))
    return write_text_atomic(text, path)


def default_sample_path() -> Path:
    """The sample prompts file in pdsr's cache (written on first use)."""
    from pdsr_sdk.models.tiny import cache_dir

    path = cache_dir() / "data" / "sample_prompts.jsonl"
    if not path.exists():
        write_sample_prompts(path)
    return path
