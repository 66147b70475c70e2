"""Independent references for the built-in math rewards (tests/rollout/test_reward_parity.py): responses a model
writes for a real MATH-500 or GSM8K row, each labelled as a human grader would score it, and the rules of
verl's default rewards as their sources read (verl/utils/reward_score: math_reward.py for MATH-500, gsm8k.py
for GSM8K, math_dapo.py for DAPO's ``Answer:`` data), written here from that reading, plus math-verify called
as its README shows. None of this imports pdsr's answer parsing."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
MATH500 = DATA / "math500.jsonl"
GSM8K = DATA / "gsm8k_test.jsonl"


@dataclass(frozen=True)
class Case:
    """A response to one data row and whether a human grader gives it the point."""
    row: str        # the row's id: MATH-500's unique_id, GSM8K's idx
    kind: str       # which way of writing it (``boxed``, ``answer_is``, ``last_box_wrong``, ...)
    response: str
    correct: bool


def math500_rows() -> list[dict]:
    return [json.loads(line) for line in MATH500.open()]


def gsm8k_rows() -> list[dict]:
    return [json.loads(line) for line in GSM8K.open()]


def gsm8k_number(row: dict) -> str:
    """The number after a GSM8K worked solution's ``####`` (as written: ``2,125``)."""
    return row["answer"].rsplit("####", 1)[1].strip()


def _number(text: str) -> Fraction | None:
    """An integer, a decimal or ``\\frac{p}{q}`` of integers written plainly; None otherwise."""
    m = re.fullmatch(r"(-?)\\[dt]?frac\{(\d+)\}\{(\d+)\}", text.strip())
    if m:
        return Fraction(int(m[2]), int(m[3])) * (-1 if m[1] else 1)
    if re.fullmatch(r"-?\d+(\.\d+)?", text.strip()):
        return Fraction(text.strip())
    return None


def _decimal(value: Fraction) -> str | None:
    """The value as a terminating decimal, exactly, or None."""
    for digits in range(7):
        if (value * 10 ** digits).denominator == 1:
            return f"{float(value):.{digits}f}" if digits else str(value.numerator)
    return None


WORK = "Let me work through this step by step.\nAfter simplifying, we get the result.\n"


def math500_cases(rows: list[dict]) -> list[Case]:
    """Ways of writing each row's answer (and ways of not answering it)."""
    out = []
    for i, row in enumerate(rows):
        a, rid = row["answer"], row["unique_id"]
        wrong = next(r["answer"] for r in rows[i + 1:] + rows[:i]
                     if r["answer"].replace(" ", "") not in a.replace(" ", "")
                     and a.replace(" ", "") not in r["answer"].replace(" ", "")
                     and (_number(a) is None or _number(r["answer"]) != _number(a)))
        out += [Case(rid, "boxed", f"{WORK}So the answer is $\\boxed{{{a}}}$.", True),
                Case(rid, "answer_is", f"{WORK}The answer is ${a}$.", True),
                Case(rid, "answer_line", f"{WORK}Answer: {a}", True),
                Case(rid, "fbox", f"{WORK}So the answer is $\\fbox{{{a}}}$.", True),
                Case(rid, "wrong", f"{WORK}So the answer is $\\boxed{{{wrong}}}$.", False),
                Case(rid, "last_box_wrong", f"I first got $\\boxed{{{a}}}$, but that is wrong.\n{WORK}"
                                            f"The answer is $\\boxed{{{wrong}}}$.", False),
                Case(rid, "last_box_right", f"I first got $\\boxed{{{wrong}}}$, but that is wrong.\n{WORK}"
                                            f"The answer is $\\boxed{{{a}}}$.", True),
                Case(rid, "no_answer", f"{WORK}I could not finish the computation.", False)]
        if "\\frac" in a:
            out.append(Case(rid, "dfrac", f"{WORK}$\\boxed{{{a.replace(chr(92) + 'frac', chr(92) + 'dfrac')}}}$", True))
        unit = re.fullmatch(r"(.*?\S)\s*\\(?:text|mbox)\{ [a-z ]+\}(\^2)?", a)
        if unit and _number(unit[1].replace("}7", "}{7}")) is not None:   # MATH's \frac{270}7\text{ degrees}
            out.append(Case(rid, "without_unit", f"{WORK}$\\boxed{{{unit[1]}}}$", True))
        value = _number(a)
        if value is None:
            continue
        if value.denominator > 1:
            out.append(Case(rid, "slash", f"{WORK}$\\boxed{{{value.numerator}/{value.denominator}}}$", True))
            if _decimal(value) is not None:
                out.append(Case(rid, "decimal", f"{WORK}$\\boxed{{{_decimal(value)}}}$", True))
        elif "." in a:
            out.append(Case(rid, "fraction", f"{WORK}$\\boxed{{\\frac{{{value.numerator}}}{{{value.denominator}}}}}$",
                            True))
        else:
            n = value.numerator
            out += [Case(rid, "period", f"{WORK}$\\boxed{{{n}.}}$", True),
                    Case(rid, "unit", f"{WORK}$\\boxed{{{n} \\text{{ units}}}}$", True),
                    Case(rid, "degrees", f"{WORK}$\\boxed{{{n}^\\circ}}$", True)]
            if abs(n) >= 1000:
                out.append(Case(rid, "thousands", f"{WORK}$\\boxed{{{n:,}}}$", True))
    return out


def gsm8k_cases(rows: list[dict]) -> list[Case]:
    out = []
    for row in rows:
        n, rid = gsm8k_number(row), str(row["idx"])
        plain = n.replace(",", "")
        value = Fraction(plain)
        wrong = str(value + 1) if value.denominator == 1 else str(float(value + 1))
        out += [Case(rid, "hashes", f"{WORK}#### {plain}", True),
                Case(rid, "hashes_period", f"{WORK}#### {plain}.", True),
                Case(rid, "hashes_dollar", f"{WORK}#### ${plain}", True),
                Case(rid, "hashes_unit", f"{WORK}#### {plain} dollars", True),
                Case(rid, "hashes_cents", f"{WORK}#### {float(value):.2f}", True),
                Case(rid, "boxed", f"{WORK}The answer is $\\boxed{{{plain}}}$.", True),
                Case(rid, "answer_is", f"{WORK}The answer is {plain}.", True),
                Case(rid, "answer_line", f"{WORK}Answer: {plain}", True),
                Case(rid, "answer_bold", f"{WORK}**Answer:** {plain}", True),
                Case(rid, "boxed_dollar", f"{WORK}The answer is $\\boxed{{\\${plain}}}$.", True),
                Case(rid, "wrong", f"{WORK}#### {wrong}", False),
                Case(rid, "last_wrong", f"{WORK}#### {plain}\nLet me check again: {WORK}#### {wrong}", False),
                Case(rid, "no_answer", f"{WORK}I could not finish the computation.", False)]
        if abs(value) >= 1000 and value.denominator == 1:
            out.append(Case(rid, "thousands", f"{WORK}#### {int(value):,}", True))
    return out


# verl's math_reward.py (data_source HuggingFaceH4/MATH-500): the last \boxed (or \fbox), the Hendrycks MATH
# normalisation, equal strings. Rules as read: a "\boxed " (with a space) anywhere wins, up to the next "$";
# \fbox is found but then refused (its unboxing expects "\boxed{"), scoring 0.

def verl_last_box(text: str) -> str | None:
    if "\\boxed " in text:
        return text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:   # an \fbox is found here, and then refused: no "\boxed{" to unwrap
        return None
    depth = 0
    for j in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if text[j] == "}" and depth == 0:
            inner = text[start:j + 1]
            return inner[len("\\boxed{"):-1] if inner.startswith("\\boxed{") else None
    return None


def _hendrycks(s: str) -> str:
    for old, new in [("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"), ("\\left", ""),
                     ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", "")]:
        s = s.replace(old, new)
    if "\\text{ " in s:
        parts = s.split("\\text{ ")
        if len(parts) != 2:
            raise ValueError("two unit texts")   # verl asserts; the caller then compares the raw strings
        s = parts[0]
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = re.sub(r"\\sqrt([^{])", r"\\sqrt{\1}", s).replace(" ", "")
    s = re.sub(r"\\frac([^{])([^{])", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac([^{])\{", r"\\frac{\1}{", s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    m = re.fullmatch(r"(\d+)/(\d+)", s)
    if m and s == f"{int(m[1])}/{int(m[2])}":
        s = f"\\frac{{{m[1]}}}{{{m[2]}}}"
    return s


def verl_math_reward(response: str, truth: str) -> bool:
    answer = verl_last_box(response)
    if answer is None:
        return False
    try:
        return _hendrycks(answer) == _hendrycks(truth)
    except (ValueError, IndexError):
        return answer == truth


def verl_gsm8k(response: str, truth: str) -> bool:
    """verl's gsm8k.py, strict: the last ``#### N`` (a sign, digits, dots, commas) in the last 300 characters,
    commas dropped, the same string as the ground truth (verl's data has it without commas)."""
    found = re.findall(r"#### (-?[0-9.,]+)", response[-300:])
    return bool(found) and found[-1].replace(",", "") == truth.replace(",", "")


_DAPO_DROP = ["square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
              "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
              "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
              "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
              r",\!", "{,}", '"', "\\dots"]


def _minerva(s: str) -> str:
    s = s.split("=")[-1]
    for old, new in [("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
                     (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}")]:
        s = s.replace(old, new)
    for word in _DAPO_DROP:
        s = s.replace(word, "")
    s = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$", s)
    for command in ("text", "textbf", "overline"):
        s = re.sub(r"\\" + command + r"\{(.*?)\}", r"\1", s)
    s = re.sub(r"\\boxed\{(.*)\}", r"\1", s)
    s = re.sub(r"frac([^{])(.)", r"frac{\1}{\2}", s)
    s = re.sub(r"sqrt([^{])", r"sqrt{\1}", s).replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def verl_math_dapo(response: str, truth: str) -> bool:
    """verl's math_dapo.py (data_source math_dapo, aime*): the last ``Answer: ...`` line in the last 300
    characters, Minerva's normalisation on both sides, equal strings (no box read at all)."""
    found = re.findall(r"(?i)Answer\s*:\s*([^\n]+)", response[-300:])
    return _minerva(found[-1] if found else "[INVALID]") == _minerva(truth)


def math_verify_direct(response: str, truth: str) -> bool:
    """math-verify as its README calls it: ``parse`` the gold and the whole response with the default
    extraction, then ``verify(gold, answer)`` (their time limits raised from 5 s, which a loaded machine overruns)."""
    from math_verify import parse, verify

    gold, answer = parse(f"${truth}$", parsing_timeout=60), parse(response, parsing_timeout=60)
    return bool(verify(gold, answer, timeout_seconds=60))


def confusion(labels: list[bool], ours: list[bool], theirs: list[bool]) -> dict[str, int]:
    """agree: both scored the same; ours_right / ours_wrong: they differ and ours matches the human label / not."""
    table = {"agree": 0, "ours_right": 0, "ours_wrong": 0, "both_wrong": 0}
    for label, a, b in zip(labels, ours, theirs):
        if a == b:
            table["agree"] += 1
            table["both_wrong"] += a != label
        else:
            table["ours_right" if a == label else "ours_wrong"] += 1
    return table
