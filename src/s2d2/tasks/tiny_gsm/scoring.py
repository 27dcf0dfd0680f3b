"""Scoring a ``tiny-gsm`` answer: the final number of a completion and whether it is the gold one."""

from __future__ import annotations

import re

__all__ = ["extract_answer", "is_correct"]

_NUM = re.compile(r"-?\d+")


def extract_answer(text: str) -> str | None:
    """The final answer in ``text``: the first number after ``####``, else the last number, else None."""
    if text is None:
        return None
    if "####" in text:
        tail = text.split("####", 1)[1]
        m = _NUM.search(tail.replace(",", ""))
        if m:
            return str(int(m.group()))
        return None
    nums = _NUM.findall(text.replace(",", ""))
    return str(int(nums[-1])) if nums else None


def is_correct(pred_text: str, gold_final: str) -> bool:
    """Whether the answer extracted from ``pred_text`` equals ``gold_final`` as an integer."""
    pred = extract_answer(pred_text)
    if pred is None:
        return False
    try:
        return int(pred) == int(str(gold_final).strip())
    except ValueError:
        return pred == str(gold_final).strip()
