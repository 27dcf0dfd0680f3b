"""Where a row stands in its current block: the block's tokens on the host and its step bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class BlockCursor:
    """The open block of one row (``ids`` is None between blocks).

    ``start`` is the absolute position of the block's first slot; ``ids`` its token ids (the mask token
    where undecided); ``n_valid`` the slots decoded (the rest lie past the request's limit);
    ``first_generated`` the first slot after the prompt. A block is decoded unit by unit (a unit is a
    Fast-dLLM v2 sub-block, else the whole block); ``step`` counts steps inside the current unit.
    """

    start: int
    ids: list[int] | None = None
    length: int = 0
    n_valid: int = 0
    first_generated: int = 0
    unit_id: int = -1
    step: int = 0
    #: LLaDA2.1: edit-only passes after the block's masks are gone, and how many are left
    in_post: bool = False
    post_left: int = 0
    #: candidates of the current step lie below this slot (the block's first stop token, else n_valid)
    candidate_limit: int = 0
    #: committed (non-mask) slots of the block before this step (routing's progress)
    n_committed: int = 0
    #: the current step's candidate slots (masked, inside the current unit, below candidate_limit)
    candidates: list[int] = field(default_factory=list)

    @property
    def is_open(self) -> bool:
        return self.ids is not None
