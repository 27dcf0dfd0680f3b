"""One configuration on the dev problems, batched: accuracy and cost figures (one tuning trial)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class DevFigures:
    """What a configuration did on the dev problems (totals over all of them)."""

    accuracy: float
    correct: int
    n: int
    nfe: int
    tokens: int
    nfe_per_token: float
    seconds: float
    seconds_per_problem: float
    verify_rate: float
    acceptance_rate: float

    def to_dict(self) -> dict[str, Any]:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DevFigures:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class DevSet:
    """The problems of a tuning run with their task (prompting and scoring) and generation length."""

    problems: list[dict]
    task: Any
    max_new_tokens: int
    chat: bool = False

    def prompts(self) -> list[str]:
        return [self.task.prompt(p, self.chat) for p in self.problems]

    def fingerprint(self) -> str:
        """A short hash of the problem ids (a resumed study must see the same problems)."""
        import hashlib

        ids = "\n".join(str(p.get("id", i)) for i, p in enumerate(self.problems))
        return hashlib.sha256(ids.encode()).hexdigest()[:16]


def evaluate(model: Any, dev: DevSet, settings: dict[str, Any]) -> DevFigures:
    """Decode every dev problem with ``settings`` (greedy where the settings say so, seed 0) as one batch
    on the model's engine, and score the answers."""
    t0 = time.perf_counter()
    results = model.generate_batch(
        dev.prompts(), chat=dev.chat, max_new_tokens=dev.max_new_tokens, seed=0, **settings
    )
    seconds = time.perf_counter() - t0
    correct = nfe = tokens = verify = drafted = accepted = 0
    for prob, res in zip(dev.problems, results, strict=True):
        correct += int(dev.task.score(prob, res.text, dev.chat).correct)
        s = res.stats
        nfe += s.nfe
        tokens += s.generated_tokens
        verify += s.nfe_verify
        drafted += s.drafted
        accepted += s.accepted
    n = len(dev.problems)
    return DevFigures(
        accuracy=correct / n,
        correct=correct,
        n=n,
        nfe=nfe,
        tokens=tokens,
        nfe_per_token=nfe / max(tokens, 1),
        seconds=seconds,
        seconds_per_problem=seconds / n,
        verify_rate=verify / max(tokens, 1),
        acceptance_rate=accepted / drafted if drafted else 0.0,
    )


__all__ = ["DevFigures", "DevSet", "evaluate"]
