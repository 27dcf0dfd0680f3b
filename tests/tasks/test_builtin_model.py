"""The shipped ``tiny-gsm`` model: loads by name, answers test problems, and S2D2 saves forwards on it."""

from __future__ import annotations

import subprocess
import sys

import pytest

import s2d2
from s2d2.model import builtin_path
from s2d2.tasks.tiny_gsm.scoring import extract_answer, is_correct
from s2d2.tasks.tiny_gsm.splits import load_split

pytestmark = pytest.mark.skipif(
    not (builtin_path("tiny-gsm") / "config.json").is_file(), reason="built-in tiny-gsm weights not shipped"
)

README_QUESTION = (
    "Priya starts with 111 shells. She gives 4 kids 11 shells each. "
    "How many shells does Priya have in the end?"
)


@pytest.fixture(scope="module")
def tiny():
    return s2d2.load()


@pytest.fixture(scope="module")
def problems():
    return load_split("test", 24)


def test_default_model_is_tiny_gsm(tiny):
    assert tiny.name == "tiny-gsm"
    assert tiny.info.family == "sdar"
    assert tiny.tokenizer is not None


def test_ar_answers_test_problems(tiny, problems):
    correct = sum(
        is_correct(tiny.generate(p["question"], decoder="ar", max_new_tokens=64).text, p["final"])
        for p in problems
    )
    # the shipped model scores about 0.96 in AR mode (MODEL_CARD.md): allow a few slips
    assert correct >= 0.8 * len(problems)


def test_lossless_matches_ar_with_fewer_forwards(tiny, problems):
    ar_nfe = s2_nfe = 0
    for p in problems[:12]:
        ar = tiny.generate(p["question"], decoder="ar", max_new_tokens=64)
        s2 = tiny.generate(p["question"], preset="lossless", block_size=8, max_new_tokens=64)
        assert s2.token_ids == ar.token_ids
        ar_nfe += ar.stats.nfe
        s2_nfe += s2.stats.nfe
    assert s2_nfe < ar_nfe


def test_readme_command_prints_a_correct_worked_answer():
    proc = subprocess.run(
        [sys.executable, "-m", "s2d2.cli", "generate", README_QUESTION],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "####" in proc.stdout
    assert extract_answer(proc.stdout) == "67"


def test_words_outside_the_vocabulary_are_named(tiny):
    import warnings

    from s2d2.model import UnknownWordsWarning

    with pytest.warns(UnknownWordsWarning, match="'capital', 'France'"):
        tiny.generate("What is the capital of France?", max_new_tokens=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tiny.generate(README_QUESTION, max_new_tokens=4)  # every word known: no warning
    question = "What is the capital of France?"
    cmd = [sys.executable, "-m", "s2d2.cli", "generate", question, "--max-new-tokens", "4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert len(lines) == 1 and "'capital', 'France'" in lines[0]


def test_freeze_loaded_heap_takes_the_loaded_model_out_of_full_collections():
    """What the server and the benchmark commands do once the model is loaded: afterwards a full
    collection no longer visits the model's objects (there are hundreds of thousands)."""
    import gc

    from s2d2.model import freeze_loaded_heap

    m = s2d2.load("tiny-gsm")
    tracked = len(gc.get_objects())
    try:
        freeze_loaded_heap()
        assert gc.get_freeze_count() >= tracked // 2
        assert len(gc.get_objects()) < tracked // 10
        assert m.generate("1+1=", max_new_tokens=4).text is not None  # frozen objects work as before
    finally:
        gc.unfreeze()
