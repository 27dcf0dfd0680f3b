"""tiny-gsm data, tokenizer and the block-diffusion training objective (no real training here)."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import s2d2
from conftest import examples
from s2d2.tasks.tiny_gsm.curriculum import (
    borrows,
    carries,
    hard_columns,
    iter_train_problems,
    keep_probability,
)
from s2d2.tasks.tiny_gsm.problems import generate_problem
from s2d2.tasks.tiny_gsm.scoring import extract_answer, is_correct
from s2d2.tasks.tiny_gsm.splits import heldout_questions, load_split, make_split, question_hash
from s2d2.tasks.tiny_gsm.tokenizer import build_tokenizer, tokenizer_dir
from s2d2.training import tiny
from s2d2.training.batches import batch_loss, build_batch
from s2d2.training.dev_eval import DEV_DECODERS, evaluate, live_model
from s2d2.training.ema import WeightEMA
from s2d2.training.loop import train_tiny
from s2d2.training.model_io import build_model, save_sdar_dir, sdar_config
from s2d2.training.schedule import BLOCK_MIX, WARMUP_STEPS, mix_at, parse_block_mix

EQ = re.compile(r"^(\d+) ([-+*/]) (\d+) = (\d+)\.$")


def _check_answer(prob: dict) -> None:
    eqs_text, final = prob["answer"].split(" #### ")
    assert final == prob["final"]
    eqs = re.findall(r"\d+ [-+*/] \d+ = \d+\.", eqs_text)
    assert " ".join(eqs) == eqs_text
    assert 2 <= len(eqs) <= 4
    numbers = [int(n) for n in re.findall(r"\d+", prob["question"] + " " + prob["answer"])]
    assert all(0 <= n <= 999 for n in numbers)
    for e in eqs:
        a, op, b, c = EQ.match(e).groups()
        a, b, c = int(a), int(b), int(c)
        if op == "+":
            assert a + b == c
        elif op == "-":
            assert a - b == c
        elif op == "*":
            assert a * b == c
        else:
            assert b != 0 and a % b == 0 and a // b == c
    # the last equation produces the final answer
    assert EQ.match(eqs[-1]).group(4) == final


def test_generator_deterministic_by_seed():
    a = [generate_problem(random.Random(7)) for _ in range(3)]
    b = [generate_problem(random.Random(7)) for _ in range(3)]
    assert a == b
    assert make_split("train", 20, seed=3) == make_split("train", 20, seed=3)
    assert make_split("train", 20, seed=3) != make_split("train", 20, seed=4)


def test_generated_answers_are_right():
    rng = random.Random(0)
    for _ in range(2000):
        _check_answer(generate_problem(rng))


def test_commutative_orders_vary():
    rng = random.Random(1)
    forms = set()
    for _ in range(500):
        ans = generate_problem(rng)["answer"]
        for a, _op, b in re.findall(r"(\d+) ([+*]) (\d+)", ans):
            forms.add(int(a) < int(b))
    assert forms == {True, False}


def test_committed_splits_match_generator():
    test = load_split("test")
    dev = load_split("dev")
    assert len(test) == 500 and len(dev) == 1000
    assert test == make_split("test", 500)
    assert dev[:200] == make_split("dev", 200)
    for p in test[:300] + dev[:300]:
        assert set(p) == {"id", "question", "answer", "final"}
        _check_answer(p)
    assert load_split("dev", 5) == dev[:5]


def test_no_overlap_between_splits():
    test_q = {p["question"] for p in load_split("test")}
    dev_q = {p["question"] for p in load_split("dev")}
    assert len(test_q) == 500 and len(dev_q) == 1000
    assert not test_q & dev_q
    train = load_split("train", 500)
    assert not {p["question"] for p in train} & (test_q | dev_q)
    held = heldout_questions()
    stream = iter_train_problems(0)
    for _ in range(300):
        assert question_hash(next(stream)["question"]) not in held


def _digit_sum(n: int) -> int:
    return sum(int(d) for d in str(n))


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_carries_and_borrows_match_the_digit_sum_identity(a, b):
    """Each carry turns 10 in one column into 1 in the next: digit sums drop by 9 per carry (and per
    borrow, read backwards), an oracle independent of the column-by-column count."""
    assert carries(a, b) * 9 == _digit_sum(a) + _digit_sum(b) - _digit_sum(a + b)
    hi, lo = max(a, b), min(a, b)
    assert borrows(hi, lo) * 9 == _digit_sum(lo) + _digit_sum(hi - lo) - _digit_sum(hi)


def test_hard_columns_counts_additions_and_subtractions_only():
    assert carries(58, 67) == 2 and carries(12, 30) == 0 and carries(999, 1) == 3
    assert borrows(100, 1) == 2 and borrows(47, 24) == 0 and borrows(52, 7) == 1
    with pytest.raises(ValueError, match="a >= b"):
        borrows(3, 5)
    # 58 + 67: two carries; 125 - 8: one borrow; 9 * 9 and 81 / 3 count nothing
    assert hard_columns("58 + 67 = 125. 125 - 8 = 117. 9 * 9 = 81. 81 / 3 = 27. #### 27") == 3
    assert hard_columns("3 * 8 = 24. 47 - 24 = 23. #### 23") == 0


def test_hard_focus_thins_easy_training_problems():
    assert [keep_probability(h, 0.6) for h in (0, 1, 2, 5)] == pytest.approx([0.4, 0.7, 1.0, 1.0])
    assert keep_probability(0, 0.0) == 1.0
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match=r"hard focus must be in \[0, 1\)"):
            keep_probability(0, bad)
        with pytest.raises(ValueError, match="hard focus"):
            next(iter_train_problems(0, hard_focus=bad))

    def take(n, **kw):
        stream = iter_train_problems(0, **kw)
        return [next(stream) for _ in range(n)]

    natural = take(600)
    # focus 0 is the natural stream, problem for problem (runs before --hard-focus reproduce)
    rng, held = random.Random("tiny-gsm-train-0-0"), heldout_questions()
    drawn = [generate_problem(rng) for _ in range(600)]
    assert natural == [p for p in drawn if question_hash(p["question"]) not in held][:600]
    focused = take(600, hard_focus=0.6)

    def share_easy(probs):
        return sum(hard_columns(p["answer"]) == 0 for p in probs) / len(probs)

    # about a third of natural problems carry or borrow nowhere; kept with probability 0.4 that falls to
    # about 0.4 * 1/3 / (expected keep rate ~0.73), i.e. under a fifth
    assert share_easy(natural) > 0.28 and share_easy(focused) < 0.22
    # a resumed stream restarts where it left off
    resumed = iter_train_problems(0, start=590, hard_focus=0.6)
    assert focused[590:] == [next(resumed) for _ in range(10)]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("3 * 8 = 24. 47 - 24 = 23. #### 23", "23"),
        ("3 * 8 = 24 . 47 - 24 = 23 . #### 23", "23"),
        ("#### 007", "7"),
        ("the answer is 12 or maybe 15", "15"),
        ("12. ####", None),
        ("no numbers here", None),
        ("", None),
        ("x = -4 #### -4", "-4"),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_is_correct():
    assert is_correct("1 + 2 = 3. #### 3", "3")
    assert not is_correct("1 + 2 = 3. #### 4", "3")
    assert is_correct("5 + 5 = 10", "10")
    assert not is_correct("", "10")


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir()))


def test_tokenizer_round_trip(tok):
    assert tok.eos_token == "<eos>" and tok.pad_token == "<pad>"
    assert tok.mask_token == "<mask>" and tok.unk_token == "<unk>"
    ids = tok.encode("24.", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids) == ["2", "@@4", "."]
    for p in load_split("test", 300):
        for text in (p["question"], p["answer"]):
            ids = tok.encode(text, add_special_tokens=False)
            assert tok.unk_token_id not in ids
            assert tok.decode(ids) == text
        assert len(tok.encode(p["question"], add_special_tokens=False)) <= 56
        assert len(tok.encode(p["answer"], add_special_tokens=False)) <= 50
    # the committed tokenizer is the one the code builds
    built = build_tokenizer(None)
    assert built.get_vocab() == tok.get_vocab()


def test_sdar_config(tok):
    cfg = sdar_config(tok)
    assert cfg["model_type"] == "sdar" and cfg["architectures"] == ["SDARForCausalLM"]
    assert cfg["mask_token_id"] == tok.mask_token_id and cfg["eos_token_id"] == tok.eos_token_id
    assert cfg["vocab_size"] >= len(tok) and cfg["tie_word_embeddings"] is False
    assert cfg["num_attention_heads"] * cfg["head_dim"] == 128


def test_training_batch_mask_hand_checked():
    M, E, P = 90, 91, 92  # mask, eos, pad ids
    prompt, answer = [10, 11, 12], [13, E]  # x = 10 11 12 13 E | E (pad to block of 2)
    rng = np.random.default_rng(0)
    b = build_batch([(prompt, answer)], rng, M, E, P, block_sizes=[2], token_causal=[False])
    ids = b["input_ids"][0].tolist()
    # clean x (6) + noisy copy of blocks 1 and 2 (positions 2..5)
    assert ids[:6] == [10, 11, 12, 13, E, E]
    assert b["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 5, 2, 3, 4, 5]
    assert ids[6] == 12  # prompt token inside a noisy block stays clean
    assert ids[7] == M  # the only answer position of block 1 is always masked
    assert M in ids[8:10]
    masked_flat = [i for i in range(6, 10) if ids[i] == M]
    assert b["loss_index"].tolist() == masked_flat
    assert b["targets"].tolist() == [[10, 11, 12, 13, E, E][b["position_ids"][0, i]] for i in masked_flat]
    T = 1
    F_ = 0
    expected = [
        # clean 0..5 (blocks 0 0 1 1 2 2)  | noisy 6..9 (blocks 1 1 2 2)
        [T, T, F_, F_, F_, F_, F_, F_, F_, F_],
        [T, T, F_, F_, F_, F_, F_, F_, F_, F_],
        [T, T, T, T, F_, F_, F_, F_, F_, F_],
        [T, T, T, T, F_, F_, F_, F_, F_, F_],
        [T, T, T, T, T, T, F_, F_, F_, F_],
        [T, T, T, T, T, T, F_, F_, F_, F_],
        [T, T, F_, F_, F_, F_, T, T, F_, F_],
        [T, T, F_, F_, F_, F_, T, T, F_, F_],
        [T, T, T, T, F_, F_, F_, F_, T, T],
        [T, T, T, T, F_, F_, F_, F_, T, T],
    ]
    assert b["attention_mask"].shape == (1, 1, 10, 10)
    assert b["attention_mask"][0, 0].int().tolist() == expected
    # token-causal clean copy: lower-triangular clean part, noisy rows unchanged
    bc = build_batch(
        [(prompt, answer)],
        np.random.default_rng(0),
        M,
        E,
        P,
        block_sizes=[2],
        token_causal=[True],
        ar_copy=[False],
    )
    m = bc["attention_mask"][0, 0].int()
    assert m[:6, :6].tolist() == torch.tril(torch.ones(6, 6, dtype=torch.int)).tolist()
    assert m[6:].tolist() == [row for row in expected[6:]]


def test_training_batch_ar_copy_shares_the_clean_copy():
    M, E, P = 90, 91, 92
    prompt, answer = [10, 11, 12], [13, E]  # x = 10 11 12 13 E E (B=2)
    b = build_batch(
        [(prompt, answer)], np.random.default_rng(0), M, E, P, block_sizes=[2], token_causal=[True]
    )
    assert b["ar_copy"] == [True]  # default for a token-causal sample with B > 1
    ids = b["input_ids"][0].tolist()
    # clean (6) + B=2 noisy copy of positions 2..5 (4) + B=1 copy of answer positions 3..5 (3)
    assert b["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 5, 2, 3, 4, 5, 3, 4, 5]
    assert ids[10:] == [M, M, M]
    m = b["attention_mask"][0, 0]
    # AR-copy query for position 4 sees clean 0..3 and itself; never the other noisy copy
    assert m[11].nonzero().flatten().tolist() == [0, 1, 2, 3, 11]
    assert not m[6:10, 10:].any() and not m[10:, 6:10].any()
    assert b["targets"].tolist()[-3:] == [13, E, E]
    with pytest.raises(ValueError, match="token-causal"):
        build_batch(
            [(prompt, answer)], np.random.default_rng(0), M, E, P, [2], token_causal=[False], ar_copy=[True]
        )


def test_training_batch_ar_mode_and_padding():
    M, E, P = 90, 91, 92
    rng = np.random.default_rng(1)
    exs = [([10, 11, 12], [13, 14, E]), ([10, 11], [13, E])]
    b = build_batch(exs, rng, M, E, P, block_sizes=[1, 1], token_causal=[False, False])
    # B=1: every answer position is masked in the noisy copy; no prompt position is copied
    assert b["input_ids"][0].tolist() == [10, 11, 12, 13, 14, E, M, M, M]
    assert b["input_ids"][1].tolist()[:6] == [10, 11, 13, E, M, M]
    assert b["input_ids"][1].tolist()[6:] == [P, P, P]
    m = b["attention_mask"][0, 0]
    # noisy query for position 4 sees clean positions 0..3 and itself only
    assert m[7].nonzero().flatten().tolist() == [0, 1, 2, 3, 7]
    # padded rows see only themselves, real rows never see padding
    m1 = b["attention_mask"][1, 0]
    assert m1[7].nonzero().flatten().tolist() == [7]
    assert not m1[:6, 6:].any()
    assert b["targets"].tolist() == [13, 14, E, 13, E]


def test_dev_eval_runs_on_the_engine_and_loss(tok, tmp_path):
    """Dev evaluation decodes the live training model through the engine: the same tokens as the saved
    checkpoint loaded with ``s2d2.load``."""
    cfg = sdar_config(tok)
    model = build_model(cfg, seed=0).eval()
    probs = load_split("dev", 3)
    live = live_model(model, tok)
    saved = s2d2.load(save_sdar_dir(model, cfg, tmp_path / "m"), device="cpu", dtype="fp32")
    for kw in DEV_DECODERS.values():
        a = live.generate_batch([p["question"] for p in probs], max_new_tokens=8, **kw)
        b = [saved.generate(p["question"], max_new_tokens=8, **kw) for p in probs]
        assert [r.token_ids for r in a] == [r.token_ids for r in b]
    res = evaluate(model, tok, probs)
    assert set(res) == {"acc_ar", "acc_dyn8", "forwards_ar", "forwards_dyn8", "score"}
    assert res["forwards_ar"] >= 1 and model.training
    model.eval()
    prompts = [tok.encode(p["question"], add_special_tokens=False) for p in probs]
    exs = [
        (pr, tok.encode(p["answer"], add_special_tokens=False) + [tok.eos_token_id])
        for pr, p in zip(prompts, probs, strict=True)
    ]
    batch = build_batch(exs, np.random.default_rng(0), tok.mask_token_id, tok.eos_token_id, tok.pad_token_id)
    loss = batch_loss(model, batch)
    assert torch.isfinite(loss) and 4.0 < float(loss.detach()) < 7.5  # ~ln(320) at init


def test_parse_block_mix_and_batches_follow_it():
    assert parse_block_mix("1=1") == {1: 1.0}
    assert parse_block_mix(" 2=.1, 16=0.25") == {2: 0.1, 16: 0.25}
    for bad in ["", "1", "0=1", "4=0", "4=-1", "x=1", "4=nan", "4=1,4=2"]:
        with pytest.raises(ValueError, match="block"):
            parse_block_mix(bad)
    M, E, P = 90, 91, 92
    exs = [([10, 11, 12], [13, 14, 15, E])] * 3
    rng = np.random.default_rng(0)
    for mix, allowed in [({1: 1.0}, {1}), ({4: 1.0, 8: 3.0}, {4, 8})]:
        batches = [build_batch(exs, rng, M, E, P, block_mix=mix) for _ in range(20)]
        seen = {b for batch in batches for b in batch["block_sizes"]}
        assert seen == allowed
    # AR mode only: every answer position is a loss position, once
    b = build_batch(exs, rng, M, E, P, block_mix={1: 1.0})
    assert b["targets"].tolist() == [13, 14, 15, E] * 3


def test_mix_at_ar_phase_then_block_mix():
    mix = {4: 1.0}
    assert mix_at(0.0, 0.0, mix) == mix  # no AR phase
    assert mix_at(0.0, 0.5, mix) == {1: 1.0}
    assert mix_at(0.499, 0.5, None) == {1: 1.0}
    assert mix_at(0.5, 0.5, mix) == mix
    assert mix_at(0.9, 0.5, None) == BLOCK_MIX
    for bad in (-0.1, 1.0, 2.0):
        with pytest.raises(ValueError, match="ar_first"):
            mix_at(0.0, bad, mix)


def test_train_tiny_compile_falls_back_to_eager(tmp_path, monkeypatch):
    """If torch.compile's code fails (e.g. no C++ compiler), training warns once and goes on eagerly."""
    import json

    calls = []

    def broken_compile(module, **kwargs):
        def run(*args, **kw):
            calls.append(1)
            raise RuntimeError("no C++ compiler")

        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    threads = torch.get_num_threads()
    try:
        with pytest.warns(UserWarning, match="torch.compile failed .*no C\\+\\+ compiler.*eagerly"):
            best = train_tiny(
                3, tmp_path / "run", steps=3, dev_size=4, progress=False, compile=True, ar_first=0.0
            )
    finally:
        torch.set_num_threads(threads)
    assert calls == [1]  # tried once, then eager for every step
    log = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r["kind"] == "done"] == [3]
    assert (best / "model.safetensors").is_file()
    # training flushes subnormals while it runs, and leaves the process's float state as it found it
    assert float.fromhex("0x1p-1074") * 1.0 > 0.0


def test_train_tiny_cli_trains_resumes_and_loads(tmp_path, capsys):
    """A short real `s2d2 train-tiny` run: writes an SDAR directory that s2d2.load() serves, resumes."""
    import json

    import s2d2
    from conftest import assert_one_line_error, run_cli

    threads = torch.get_num_threads()
    out = tmp_path / "run"
    try:
        args = ["train-tiny", "--out", str(out), "--minutes", "3", "--dev-size", "16", "--eval-every", "60"]
        args.append("--no-compile")  # compilation alone takes a minute; test_train_tiny_compile_falls_back
        first = ["--steps", "12", "--ar-first", "0.7", "--lr", "3e-3", "--ema", "0.9", "--hard-focus", "0.5"]
        code, stdout, _ = run_cli(capsys, *args, *first)
        assert code == 0 and "best model:" in stdout
        # --ema: best/ (saved at the step-12 evaluation, the last step) holds the averaged weights
        ck = torch.load(out / "ckpt.pt", weights_only=False)
        assert (ck["ema_decay"], ck["ema"]["updates"]) == (0.9, 12)
        from safetensors.torch import load_file

        saved = load_file(str(out / "best" / "model.safetensors"))
        names = [n for n, _ in build_model(ck["config"]).named_parameters()]
        assert all(torch.equal(saved[n], e) for n, e in zip(names, ck["ema"]["shadow"], strict=True))
        assert not all(torch.equal(saved[n], ck["model"][n]) for n in names)
        log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
        assert [r["step"] for r in log if r["kind"] == "eval"] == [12]
        # --ar-first 0.7: AR mode only (B=1) at the start, the block mix from 70% of the budget on
        sizes = {r["step"]: r["block_size"] for r in log if r["kind"] == "train"}
        assert sizes[1] == 1 and sizes[10] in BLOCK_MIX
        assert json.loads((out / "best" / "config.json").read_text())["model_type"] == "sdar"
        first_lr = [r["lr"] for r in log if r["kind"] == "train" and r["step"] == 1]
        assert first_lr == [pytest.approx(3e-3 / WARMUP_STEPS, rel=0.01)]  # --lr is the warm-up's target
        # resuming continues from the checkpoint (step 12), not from scratch
        code, _, _ = run_cli(capsys, *args, "--steps", "20")
        assert code == 0
        log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
        assert [r["step"] for r in log if r["kind"] == "eval"] == [12, 20]
        assert [r["lr"] for r in log if r["kind"] == "train" and r["step"] == 1] == first_lr
        ck = torch.load(out / "ckpt.pt", weights_only=False)
        assert (ck["ar_first"], ck["lr"], ck["ema_decay"], ck["hard_focus"]) == (0.7, 3e-3, 0.9, 0.5)  # kept
        assert ck["ema"]["updates"] == 20
        code, _, err = run_cli(capsys, "train-tiny", "--out", str(out), "--steps", "0")
        assert_one_line_error(code, err, "--steps")
        code, _, err = run_cli(capsys, "train-tiny", "--out", str(out), "--block-mix", "4=1,x")
        assert_one_line_error(code, err, "--block-mix")
        code, _, err = run_cli(capsys, "train-tiny", "--out", str(out), "--ar-first", "1")
        assert_one_line_error(code, err, "--ar-first")
        code, _, err = run_cli(capsys, "train-tiny", "--out", str(out), "--lr", "0")
        assert_one_line_error(code, err, "--lr")
        code, _, err = run_cli(capsys, "train-tiny", "--out", str(out), "--ema", "1")
        assert_one_line_error(code, err, "--ema")
        code, _, err = run_cli(capsys, "train-tiny", "--out", str(out), "--hard-focus", "1")
        assert_one_line_error(code, err, "--hard-focus")
        assert json.loads((out / "best" / "config.json").read_text())["model_type"] == "sdar"  # untouched
    finally:
        torch.set_num_threads(threads)
    model = s2d2.load(str(out / "best"))
    assert model.adapter.info.mask_token_id == build_tokenizer(None).mask_token_id
    res = model.generate(
        "Ana has 3 pens. She buys 2 more pens. How many pens does Ana have now?", max_new_tokens=5
    )
    assert 1 <= len(res.token_ids) <= 5


def test_weight_ema_averages_swaps_and_restores():
    """WeightEMA: warm-up decay (1+n)/(10+n) capped at the decay, exact lerp, swap in and back out."""
    lin = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        lin.weight.fill_(0.0)
    ema = WeightEMA(lin, 0.5)
    with torch.no_grad():
        lin.weight.fill_(1.0)
    ema.update()  # decay min(0.5, 1/10) = 0.1: 0.1 * 0 + 0.9 * 1
    assert torch.allclose(ema.shadow[0], torch.full((1, 2), 0.9))
    ema.update()  # decay min(0.5, 2/11) = 2/11
    assert torch.allclose(ema.shadow[0], torch.full((1, 2), 0.9 * 2 / 11 + 9 / 11))
    for _ in range(20):
        ema.update()
    assert ema.updates == 22
    with ema.swapped_in():
        assert torch.equal(lin.weight, ema.shadow[0])
    assert torch.equal(lin.weight, torch.ones(1, 2))  # live weights restored
    state = ema.state_dict()
    other = WeightEMA(lin, 0.2)
    other.load_state_dict(state)
    # the average and its count come back; the decay stays this instance's (a resume may change it)
    assert (other.decay, other.updates) == (0.2, 22) and torch.equal(other.shadow[0], ema.shadow[0])
    with pytest.raises(ValueError, match="EMA decay"):
        WeightEMA(lin, 1.0)


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--ema", "1", "EMA decay must be in [0, 1), got 1.0"),
        ("--lr", "0", "learning rate must be in (0, 1), got 0.0"),
        ("--ar-first", "1", "ar_first must be in [0, 1), got 1.0"),
        ("--ar-first", "half", "could not convert string to float: 'half'"),
        ("--hard-focus", "1", "hard focus must be in [0, 1), got 1.0"),
        ("--block-mix", "8=.5,8=.5", "block size 8 appears twice in the block mix"),
        ("--block-mix", "4", "bad block mix entry '4': expected B=WEIGHT with B >= 1, WEIGHT > 0"),
    ],
)
def test_module_entry_point_rejects_bad_values_with_a_usage_error(tmp_path, capsys, flag, value, message):
    """`python -m s2d2.training.tiny` checks --ema/--lr/--ar-first/--block-mix/--hard-focus like
    `s2d2 train-tiny`: no traceback."""
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        tiny.main(["--minutes", "1", "--out", str(out), flag, value])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: argument {flag}: {message}")
    assert not out.exists()
