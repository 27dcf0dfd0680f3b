"""Prompt scoring over HTTP: ``echo`` with ``logprobs`` (``max_tokens: 0`` allowed) and vLLM's
``prompt_logprobs`` give each prompt token's exact AR-mode logprob, ``model.score``'s; lm-eval's
``local-completions`` model pointed at ``s2d2 serve`` gives the in-process ``s2d2`` model's
log-likelihoods (within 1e-4) and accuracy on the multiple-choice task of
``s2d2.evaluation.lm_eval_tasks``."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from test_server import free_port, running_server, start_server  # noqa: E402

import s2d2  # noqa: E402
from s2d2.serving.app import create_app  # noqa: E402
from s2d2.tasks.tiny_gsm.splits import load_split  # noqa: E402

QUESTIONS = [p["question"] for p in load_split("test")[:3]]
#: multiple-choice problems scored both ways (4 choices each)
N_MC = 40


@pytest.fixture(scope="module")
def model():
    return s2d2.load("tiny-gsm", max_num_seqs=8)


@pytest.fixture(scope="module")
def url(model):
    with running_server(create_app(model, max_num_seqs=8)) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def test_echo_with_max_tokens_0_scores_the_prompt_exactly(client, model):
    out = client.completions.create(model="tiny-gsm", prompt=QUESTIONS, max_tokens=0, echo=True, logprobs=2)
    assert out.usage.completion_tokens == 0
    assert out.usage.prompt_tokens == sum(len(model.encode(q)) for q in QUESTIONS)
    for q, choice in zip(QUESTIONS, sorted(out.choices, key=lambda c: c.index), strict=True):
        ids = model.encode(q)
        [want] = model.score([(ids[:1], ids[1:])], top_logprobs=2)
        lp = choice.logprobs
        assert choice.text == q and choice.finish_reason == "length"
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert lp.token_logprobs[1:] == pytest.approx(want.logprobs, abs=1e-6)
        assert "".join(lp.tokens) == model.decode_ids(ids)
        assert lp.token_sources == [None] + ["ar"] * (len(ids) - 1)
        for token, value, top, alts in zip(
            lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:], want.top, strict=True
        ):
            assert top[token] == value
            assert max(top.values()) == pytest.approx(alts[0][1], abs=1e-6)
    streamed = list(
        client.completions.create(
            model="tiny-gsm", prompt=QUESTIONS[0], max_tokens=0, echo=True, logprobs=2, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == QUESTIONS[0]
    [first] = [c.choices[0].logprobs for c in streamed if c.choices and c.choices[0].logprobs]
    plain = sorted(out.choices, key=lambda c: c.index)[0].logprobs
    assert (first.tokens, first.token_logprobs, first.top_logprobs) == (
        plain.tokens,
        plain.token_logprobs,
        plain.top_logprobs,
    )
    assert [c.choices[0].finish_reason for c in streamed if c.choices][-1] == "length"


def test_max_tokens_0_needs_echo(url):
    for path, body in (
        ("/v1/completions", {"prompt": "Tom has 3 apples.", "max_tokens": 0, "logprobs": 1}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}),
    ):
        r = httpx.post(url + path, json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": -1, "echo": True})
    assert r.status_code == 400


def test_echo_scores_are_those_of_a_decoding_request(client):
    """max_tokens 0 and lm-eval's max_tokens 1 (echo, logprobs 1) score the prompt the same."""
    kw = dict(model="tiny-gsm", prompt=QUESTIONS[1], echo=True, logprobs=1)
    zero = client.completions.create(max_tokens=0, **kw).choices[0].logprobs
    one = client.completions.create(max_tokens=1, **kw).choices[0].logprobs
    n = len(zero.tokens)
    assert len(one.tokens) == n + 1
    assert one.token_logprobs[:n] == zero.token_logprobs and one.top_logprobs[:n] == zero.top_logprobs


def test_vllm_prompt_logprobs(url, model):
    body = {"prompt": QUESTIONS[0], "max_tokens": 0, "echo": True, "logprobs": 0, "prompt_logprobs": 3}
    choice = httpx.post(url + "/v1/completions", json=body).json()["choices"][0]
    ids = model.encode(QUESTIONS[0])
    [want] = model.score([(ids[:1], ids[1:])], top_logprobs=3)
    prompt = choice["prompt_logprobs"]
    assert prompt[0] is None and len(prompt) == len(ids)
    assert [p[str(t)]["logprob"] for p, t in zip(prompt[1:], ids[1:], strict=True)] == choice["logprobs"][
        "token_logprobs"
    ][1:]
    for entry, tok, lp, alts, text in zip(
        prompt[1:], ids[1:], want.logprobs, want.top, choice["logprobs"]["tokens"][1:], strict=True
    ):
        assert entry[str(tok)]["logprob"] == pytest.approx(lp, abs=1e-6)
        assert entry[str(tok)]["decoded_token"] == text
        ranked = {int(k): v["rank"] for k, v in entry.items() if k != str(tok)}
        assert [t for t, _ in alts if t != tok] == sorted(ranked, key=ranked.get)
        own = entry[str(tok)]["rank"]
        assert own == next((r + 1 for r, (t, _) in enumerate(alts) if t == tok), None)
    # without echo the choice's text is the completion alone, and prompt_logprobs are there all the same
    plain = httpx.post(
        url + "/v1/completions", json={"prompt": QUESTIONS[0], "max_tokens": 4, "prompt_logprobs": 0}
    )
    assert plain.json()["choices"][0]["prompt_logprobs"][1:] == [
        {str(t): e[str(t)]} for e, t in zip(prompt[1:], ids[1:], strict=True)
    ]
    refused = httpx.post(url + "/v1/completions", json={"prompt": "hi", "stream": True, "prompt_logprobs": 1})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt_logprobs"


# ---------------------------------------------------------------------------------------------- lm-eval
def _mc_samples(model, tasks: Path) -> tuple[float, dict[int, list[tuple[float, bool]]]]:
    """lm-eval's accuracy on tiny_gsm_mc and, per doc, each choice's (log-likelihood, is_greedy)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(
        model=model,
        tasks=["tiny_gsm_mc"],
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        bootstrap_iters=0,
        log_samples=True,
    )
    samples = {
        s["doc_id"]: [(float(r[0][0]), r[0][1] in (True, "True")) for r in s["resps"]]
        for s in out["samples"]["tiny_gsm_mc"]
    }
    return out["results"]["tiny_gsm_mc"]["acc,none"], samples


def test_lm_eval_local_completions_equals_the_in_process_model(tmp_path):
    pytest.importorskip("lm_eval")
    pytest.importorskip("tenacity")  # lm-eval's API models need it (the eval extra brings it)
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    from s2d2.evaluation.lm_eval_model import S2D2LM
    from s2d2.evaluation.lm_eval_tasks import write_tiny_gsm_tasks
    from s2d2.model import builtin_path

    write_tiny_gsm_tasks(tmp_path, N_MC)
    acc_ref, ref = _mc_samples(S2D2LM(model="tiny-gsm", device="cpu", batch_size=16), tmp_path)
    port = free_port()
    proc = start_server(port)
    try:
        api = LocalCompletionsAPI(
            model="tiny-gsm",
            base_url=f"http://127.0.0.1:{port}/v1/completions",
            tokenizer_backend="huggingface",
            tokenizer=str(builtin_path("tiny-gsm")),
            batch_size=8,
            max_retries=1,
        )
        acc, got = _mc_samples(api, tmp_path)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert len(got) == len(ref) == N_MC
    for doc, choices in ref.items():
        assert len(got[doc]) == len(choices) == 4
        for (ll, greedy), (ll_ref, greedy_ref) in zip(got[doc], choices, strict=True):
            assert abs(ll - ll_ref) < 1e-4 and greedy == greedy_ref
    assert acc == acc_ref >= 0.75
