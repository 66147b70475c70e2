"""Math answers compared as text: a response's final answer (its last ``\\boxed{}``, else its last ``#### N``, else its
last ``Answer: N``),
answers normalised, and exact rational values, so that 1/2, ``\\frac{1}{2}``, ``\\dfrac12`` and 0.5 compare equal
(``math_boxed``, and ``math_verify``'s fallback)."""

from __future__ import annotations

import re
from fractions import Fraction


#: ``\\boxed`` or ``\\fbox``, then its argument: ``{...}`` (spaces before the brace allowed), or a space and one
#: word, ``\\boxed 7`` (what TeX also reads as a box); not a longer command such as ``\\boxedanswer``
_BOX = re.compile(r"\\(?:boxed|fbox)(?:\s*(\{)|\s+([^\s${}]+))")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, or of the last
    ``\\boxed 7`` (the word after it, without a final period or comma). A brace further on in the text is no
    box's (``\\boxed 5 since $x^{2}$`` is 5, not 2); a last box left open (a response cut off) is None."""
    found = None
    for found in _BOX.finditer(text):
        pass
    if found is None:
        return None
    if found.group(1) is None:
        return found.group(2).rstrip(".,;:") or None
    end = _closing_brace(text, found.start(1))   # unclosed (a response cut off in it): no answer
    return None if end < 0 else text[found.start(1) + 1:end]


#: GSM8K's final-answer line, ``#### 18`` (verl's gsm8k prompt asks for it; its reward reads the last one)
_HASHES = re.compile(r"####[ \t]*([^\n]*)")


#: a ``####`` line that is a Markdown heading (``#### Explanation``, ``#### Step 2: ...``), not an answer: a word
_HEADING = re.compile(r"[A-Za-z]{2,}\b")
#: GSM8K's answer, a number, with words of a unit after it (``18 dollars``: verl's gsm8k reward reads the number)
_NUMBER_AND_UNIT = re.compile(r"(\\?\$?\s*[-+\u2212]?\d[\d,]*(?:\.\d+)?%?)\s+[A-Za-z][A-Za-z ]*[.!]?")


#: DAPO's final-answer line, ``Answer: 34`` (DAPO-Math-17k's prompt asks for it; verl's math_dapo reads the last one):
#: at the start of a line (Markdown before it allowed), so that prose such as "To answer: first we count 18 eggs"
#: is no answer line (math-verify would find 18 in it)
_ANSWER_LINE = re.compile(r"^[ \t*#>]*(?:final[ \t]+)?answer[ \t]*:[ \t*]*([^\n]*)", re.IGNORECASE | re.MULTILINE)


def response_answer(text: str) -> str | None:
    """A response's final answer: the content of its last ``\\boxed{}`` (:func:`last_boxed`), else what follows
    its last ``####`` on that line (GSM8K's format: verl's gsm8k data asks for ``#### N``), Markdown bold
    around it dropped, a Markdown heading after it skipped (``#### Explanation``), and unit words after a
    number dropped (``#### 18 dollars`` is 18), else what follows the last ``Answer:`` that begins a line (DAPO's
    format, ``**Answer:** 18`` too); None when it has none of them (or those lines are empty)."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    found = [a for a in (f.strip().strip("*").strip() for f in _HASHES.findall(text)) if a]
    if found:
        answer = next((a for a in reversed(found) if not _HEADING.match(a)), found[-1])
    else:
        lines = [a for a in (f.strip().strip("*").strip() for f in _ANSWER_LINE.findall(text)) if a]
        if not lines:
            return None
        answer = lines[-1]
    unit = _NUMBER_AND_UNIT.fullmatch(answer)
    return unit.group(1) if unit else answer


_STRIP = [
    (re.compile("\u2212"), "-"),   # Unicode's minus sign
    (re.compile(r"(?<=\d)\{,\}(?=\d)"), ","),   # TeX's 1{,}000
    (re.compile(r"\\(?:left|right|!|,|;|:|quad|qquad)"), ""),
    (re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}"), r"\1"),
    (re.compile(r"\\[dt]frac"), r"\\frac"),
    (re.compile(r"\^\{?\\circ\}?|°"), ""),
    (re.compile(r"\\%|%"), ""),
    (re.compile(r"\s+"), ""),
    (re.compile(r"\\?\$"), ""),   # $18 and \$18
    # TeX's one-character arguments in braces, so that \frac32 is \frac{3}{2} and \sqrt2 is \sqrt{2} as text too
    (re.compile(r"\\sqrt(\w)"), r"\\sqrt{\1}"),
    (re.compile(r"\\frac(\d)(\d)"), r"\\frac{\1}{\2}"),
    (re.compile(r"\\frac(\d)\{"), r"\\frac{\1}{"),
    (re.compile(r"\\frac(\{[^{}]*\})(\d)"), r"\\frac\1{\2}"),
]


#: a unit in text after the value at the end of an answer: ``12 \\text{ cm}``, MATH-500's ``15\\mbox{ cm}^2``
_RIGHT_UNIT = re.compile(r"(.*?\S)\s*\\(?:text|mbox|mathrm)\{\s*[A-Za-z][A-Za-z ]*\}(?:\^\{?[23]\}?)?")


def normalize_answer(answer: str) -> str:
    """Light normalisation: strip spacing commands, text wrappers, units of degrees and
    percent, dollar signs and whitespace; drop a trailing period; '0.50' -> '0.5'; Unicode's minus sign is '-', and
    TeX's ``1{,}000`` is 1,000 (then 1000, as any thousands separator); a choice in parentheses is its letter
    (``\\text{(C)}`` is C); TeX's one-character arguments braced (``\\frac32`` -> ``\\frac{3}{2}``, ``\\sqrt2`` ->
    ``\\sqrt{2}``). A number with a unit in text after it is the number (``864 \\mbox{ inches}^2`` is 864, as
    verl's MATH reward drops a ``\\text{ unit}``); a word alone in text stays (``\\text{Evelyn}``)."""
    unit = _RIGHT_UNIT.fullmatch(answer.strip())
    if unit is not None:
        value = normalize_answer(unit.group(1))
        if exact_value(value) is not None:
            return value
    s = answer.strip()
    for pattern, repl in _STRIP:
        s = pattern.sub(repl, s)
    s = s.rstrip(".")
    choice = re.fullmatch(r"\(([A-Z])\)", s)   # a multiple-choice answer, MATH's \text{(C)}: the letter
    if choice:
        s = choice.group(1)
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    if re.fullmatch(r"-?\d+\.\d+", s):
        s = s.rstrip("0").rstrip(".")
    return s


_UNSIGNED = re.compile(r"\d+(?:\.\d*)?|\.\d+")


def exact_value(answer: str) -> Fraction | None:
    """The exact rational value of a number written as an integer, a decimal, ``a/b`` or
    ``\\frac{a}{b}`` (also ``\\dfrac``/``\\tfrac`` and the short ``\\frac12``), with a sign; None for
    anything else (expressions, mixed numbers, units, lists). Decimals are exact: 0.333 is
    333/1000, not 1/3. Expects the output of :func:`normalize_answer` (no spaces)."""
    s = answer
    while len(s) >= 2 and s[0] == "{" and s[-1] == "}" and _closing_brace(s, 0) == len(s) - 1:
        s = s[1:-1]
    sign = 1
    if s[:1] in ("+", "-"):
        sign, s = (-1 if s[0] == "-" else 1), s[1:]
    if _UNSIGNED.fullmatch(s):
        return sign * Fraction(s)
    if s.startswith("\\frac") or s.startswith("\\dfrac") or s.startswith("\\tfrac"):
        rest = s[s.index("frac") + 4:]
        num, rest = _frac_argument(rest)
        den, rest = _frac_argument(rest) if num is not None else (None, rest)
        if num is None or den is None or rest:
            return None
        top, bottom = exact_value(num), exact_value(den)
    elif s.count("/") == 1:
        a, b = s.split("/")
        if a[:1] in ("+", "-") or not _UNSIGNED.fullmatch(a):
            return None
        top, bottom = Fraction(a), exact_value(b)
    else:
        return None
    if top is None or bottom is None or bottom == 0:
        return None
    return sign * top / bottom


def _frac_argument(s: str) -> tuple[str | None, str]:
    """One argument of ``\\frac``: ``{...}`` or a single digit (``\\frac12``); (argument, rest)."""
    if s[:1] == "{":
        end = _closing_brace(s, 0)
        return (None, s) if end < 0 else (s[1:end], s[end + 1:])
    if s[:1].isdigit():
        return s[0], s[1:]
    return None, s


def _closing_brace(s: str, i: int) -> int:
    """Index of the brace closing the one at ``s[i]`` (balanced), or -1."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return -1


#: a single variable assigned, ``x = `` or ``a_1 =``, before a right-hand side with no other ``=``
_ASSIGNMENT = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?=[^=]+$)")


def drop_assignment(answer: str) -> str:
    """The value of an answer that assigns it to a variable (``x = 5`` is 5, ``a_1 = -3`` is -3); any other
    answer as it is (``x = 5 = y``, ``2x = 3``)."""
    return _ASSIGNMENT.sub("", answer, count=1)


def answers_equal(predicted: str, truth: str) -> bool:
    """Equal after :func:`normalize_answer`, or both numbers of the same exact value (:func:`exact_value`); where
    one of them assigns a variable and the other has no ``=``, that one's value (:func:`drop_assignment`, as
    verl's MATH reward and math-verify read ``x = 5``)."""
    p, t = normalize_answer(predicted), normalize_answer(truth)
    if _normalized_equal(p, t):
        return True
    if ("=" in p) != ("=" in t):
        return _normalized_equal(drop_assignment(p), drop_assignment(t))
    return False


def _normalized_equal(p: str, t: str) -> bool:
    if p == t:
        return True
    vp = exact_value(p)
    return vp is not None and vp == exact_value(t)
