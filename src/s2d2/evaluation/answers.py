"""Answer extraction: the final number of a math solution (normalised) and the code of a completion.

* numbers: :func:`normalize_number` (commas, ``$``, trailing ``.0``), :func:`extract_gsm8k_answer` (the
  last ``\\boxed{...}``, else the number after ``####``, else the last number) and :func:`gsm8k_gold`;
* code: :func:`extract_code`, the first fenced block (else the raw completion).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from ..errors import S2D2Error

__all__ = [
    "extract_code",
    "extract_gsm8k_answer",
    "first_number",
    "gsm8k_gold",
    "last_number",
    "normalize_number",
]


# ---------------------------------------------------------------------------------------------- numbers
_NUMBER = re.compile(r"-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)")


def normalize_number(text: str | None) -> str | None:
    """Canonical form of a number: no commas / ``$`` / spaces, no trailing ``.0``; None if not a number.

    ``"1,000"`` -> ``"1000"``, ``"18.0"`` -> ``"18"``, ``"-3.50"`` -> ``"-3.5"``, ``"$7"`` -> ``"7"``.
    """
    if text is None:
        return None
    s = str(text).strip().replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    if not s:
        return None
    try:
        d = Decimal(s)
    except InvalidOperation:
        return None
    if not d.is_finite():
        return None
    if d == d.to_integral_value():
        return str(int(d))
    return format(d.normalize(), "f")


def last_number(text: str) -> str | None:
    nums = [n.rstrip(",") for n in _NUMBER.findall(text)]
    nums = [n for n in nums if n not in ("", "-")]
    return normalize_number(nums[-1]) if nums else None


def first_number(text: str) -> str | None:
    for n in _NUMBER.findall(text):
        n = n.rstrip(",")
        if n and n != "-":
            return normalize_number(n)
    return None


def _boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` / ``\\fbox{...}`` (braces balanced; unclosed ones skipped)."""
    out = []
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
            i += 1
        if depth == 0:
            out.append(text[m.end() : i - 1])
    return out


def extract_gsm8k_answer(text: str | None) -> str | None:
    """The final answer of a GSM8K solution, normalised (see :func:`normalize_number`), or None.

    Priority: the last ``\\boxed{...}`` holding a number (its last number, so ``\\boxed{x = 5}`` gives 5),
    then the first number after the last ``####``, then the last number in the text.
    """
    if not text:
        return None
    for content in reversed(_boxed_contents(text)):
        content = re.sub(r"\\(?:text|mathrm|textbf)\{[^{}]*\}", " ", content)  # units: \text{ dollars}
        num = last_number(content.replace("\\!", "").replace("{,}", ","))
        if num is not None:
            return num
    if "####" in text:
        num = first_number(text.rsplit("####", 1)[1])
        if num is not None:
            return num
    return last_number(text)


def gsm8k_gold(record: dict) -> str:
    """The reference answer of a GSM8K record: ``final`` if given, else the number after ``####``."""
    if record.get("final") is not None:
        gold = normalize_number(str(record["final"]))
    else:
        answer = str(record.get("answer", ""))
        tail = answer.rsplit("####", 1)[1] if "####" in answer else answer
        gold = first_number(tail) if "####" in answer else last_number(tail)
    if gold is None:
        raise S2D2Error(f"cannot read a numeric reference answer from record {record.get('id', '?')!r}")
    return gold


# ---------------------------------------------------------------------------------------------- code
_FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(text: str) -> tuple[str, bool]:
    """The code in the first fenced block (```` ```python ... ``` ````; an unclosed block runs to the end of
    the text), else the raw text. Returns ``(code, from_block)``."""
    m = _FENCE.search(text or "")
    if m:
        return m.group(1), True
    return text or "", False
