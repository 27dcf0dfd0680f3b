"""A decode trace laid out for people: every step of every block, with the block's tokens as they stand.

:func:`build_view` turns the engine's per-step trace (:class:`~s2d2.decoding.stats.StepTrace`) into
:class:`TraceView`, which both renderers (terminal and HTML) draw. A cell's ``kind`` is how its token was
committed (``ar``, ``accepted``, ``resampled``, ``fallback``, ``baseline``, ``edited``), or ``prompt`` for
prompt tokens inside the block, or ``mask`` for a position still masked; ``new`` marks the tokens the step
itself committed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: How tokens are committed, in legend order, with what each means.
KINDS: dict[str, str] = {
    "accepted": "draft accepted by the verifier",
    "predraft": "pre-drafted token (drafted inside the previous verification) accepted by the verifier",
    "resampled": "AR correction / resample at the first rejection",
    "ar": "AR token (shifted model, first slot)",
    "fallback": "committed unverified by the fallback rule",
    "baseline": "baseline decoder commit",
    "edited": "token edit",
}


@dataclass
class Cell:
    """One block position at one step."""

    position: int
    token: int | None
    text: str
    kind: str
    new: bool = False
    confidence: float | None = None
    q_prob: float | None = None


@dataclass
class StepView:
    """One decoding step: its forward kind, the running NFE after it, and the block's cells."""

    index: int
    block_index: int
    block_start: int
    step: int
    kind: str
    nfe: int
    verified: bool
    span: int
    accepted: int
    cells: list[Cell]
    #: the step planner's choice (``plan=auto``): mode, k, predicted and measured forward ms; "" if none
    plan: str = ""

    @property
    def new_cells(self) -> list[Cell]:
        return [c for c in self.cells if c.new]


@dataclass
class TraceView:
    """Every step, the commit counts by kind and a summary."""

    steps: list[StepView]
    counts: dict[str, int]
    summary: dict[str, Any] = field(default_factory=dict)
    prompt_text: str = ""
    output_text: str = ""


def plan_label(plan: dict[str, Any] | None) -> str:
    """A step plan as one line: ``plan fused k=8 +2 groups, 1.23 ms predicted / 1.40 measured``."""
    if not plan:
        return ""
    groups = f" +{plan['positions']} groups" if plan.get("mode") == "fused" else ""
    measured = plan.get("measured_ms")
    clock = f"{plan.get('predicted_ms', 0):.2f} ms predicted" + (
        f" / {measured:.2f} measured" if measured is not None else ""
    )
    return f"plan {plan['mode']} k={plan['k']}{groups}, {clock}"


def commit_counts(trace: Sequence[Any]) -> dict[str, int]:
    """Commits by how they were made, over the whole trace."""
    return dict(Counter(how for st in trace for _, _, how in st.commits))


def build_view(
    trace: Sequence[Any],
    prompt_ids: Sequence[int],
    block_size: int,
    token_text: Callable[[int], str],
    *,
    stats: Any = None,
    prompt_text: str = "",
    output_text: str = "",
) -> TraceView:
    """Lay out ``trace`` (a generation's ``result.trace``) block by block; ``stats`` (the generation's
    statistics) adds the prefill forwards to the running NFE and fills the summary."""
    n_prompt = len(prompt_ids)
    last = max([n_prompt - 1] + [pos for st in trace for pos, _, _ in st.commits])
    state: dict[int, Cell] = {}
    nfe = int(getattr(stats, "nfe_prefill", 0) or 0)
    steps: list[StepView] = []
    block_of: dict[int, int] = {}
    for i, st in enumerate(trace):
        block_index = block_of.setdefault(st.block_start, len(block_of))
        probs = list(getattr(st, "probs", []) or [])
        new: dict[int, Cell] = {}
        for j, (pos, tok, how) in enumerate(st.commits):
            conf, q = probs[j] if j < len(probs) else (None, None)
            new[pos] = state[pos] = Cell(pos, tok, token_text(tok), how, False, conf, q)
        predrafted = bool(getattr(st, "predrafted", False))
        nfe += int(not predrafted) + int(st.verified)  # a pre-drafted step needs no draft forward
        cells = []
        for pos in range(st.block_start, min(st.block_start + block_size, last + 1)):
            if pos < n_prompt:
                cells.append(Cell(pos, int(prompt_ids[pos]), token_text(int(prompt_ids[pos])), "prompt"))
            elif pos in state:
                c = state[pos]
                cells.append(Cell(pos, c.token, c.text, c.kind, pos in new, c.confidence, c.q_prob))
            else:
                cells.append(Cell(pos, None, "·", "mask"))
        kind = ("pre-draft" if predrafted else "draft") + (" + verify" if st.verified else "")
        steps.append(StepView(i, block_index, st.block_start, st.step, kind, nfe, st.verified, st.span,
                              st.accepted, cells, plan_label(getattr(st, "plan", None))))  # fmt: skip
    counts = commit_counts(trace)
    return TraceView(steps, counts, _summary(steps, counts, stats, nfe), prompt_text, output_text)


def _summary(steps: list[StepView], counts: dict[str, int], stats: Any, nfe: int) -> dict[str, Any]:
    verified = [s for s in steps if s.verified]
    drafted = sum(s.span for s in verified)
    accepted = sum(s.accepted for s in verified)
    out: dict[str, Any] = {
        "steps": len(steps),
        "blocks": len({s.block_start for s in steps}),
        "verifications": len(verified),
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
        "nfe": nfe,
        "commits": dict(counts),
    }
    if stats is not None:
        out["nfe"] = int(stats.nfe)
        out["tokens"] = int(stats.generated_tokens)
        out["nfe_per_token"] = round(stats.nfe_per_token, 4)
        out["nfe_prefill"] = int(stats.nfe_prefill)
        out["finish_reason"] = stats.finish_reason
    return out


__all__ = ["KINDS", "Cell", "StepView", "TraceView", "build_view", "commit_counts"]
