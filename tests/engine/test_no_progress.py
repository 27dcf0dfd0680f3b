"""Every row ends (docs/ENGINE.md, "Every row ends"): a row that commits nothing for
``NO_PROGRESS_FORWARDS`` forwards fails alone with a clear error, for every decoder, while its batch-mates
decode as they would alone."""

from __future__ import annotations

import pytest

import s2d2
from s2d2.engine.llm_engine import LLMEngine
from s2d2.engine.step import host
from s2d2.engine.step.progress import NO_PROGRESS_FORWARDS

QUESTIONS = ["Ben has 3 apples. He buys 2 more. How many apples does Ben have?", "Tom has 5 toys."]


@pytest.fixture(scope="module")
def model():
    return s2d2.load("tiny-gsm", max_num_seqs=4)


@pytest.mark.parametrize(
    "settings", [{"decoder": "ar"}, {"decoder": "dynamic"}, {"decoder": "static"}, {}, {"preset": "lossless"}]
)
def test_a_row_that_cannot_progress_ends_alone(model, settings, monkeypatch):
    prompts = [model.encode(q) for q in QUESTIONS]
    cfg = model.make_config(max_new_tokens=16, **settings)
    alone = LLMEngine(model.adapter, max_num_seqs=4).generate(prompts[1:], [cfg])
    stuck = prompts[0]
    engine = LLMEngine(model.adapter, max_num_seqs=4)
    engine.lanes = False  # every row's step goes through apply (the lanes commit in their own way)
    monkeypatch.setattr("s2d2.engine.step.postprocess.apply", _apply_skipping(host.apply, stuck))
    outs = engine.generate(prompts, [cfg, cfg])
    assert outs[0].status == "failed" and "no progress" in outs[0].error
    assert str(NO_PROGRESS_FORWARDS) in outs[0].error
    assert engine.stats()["forwards"] <= NO_PROGRESS_FORWARDS + 2 * cfg.max_new_tokens + 8
    assert outs[1].status == "finished" and outs[1].token_ids == alone[0].token_ids


def _apply_skipping(real, stuck):
    def apply(w):
        if w.req.prompt.tolist() == stuck and w.req.cursor.ids is not None:
            return None  # the row's step commits nothing and keeps its next forward as it was
        return real(w)

    return apply
