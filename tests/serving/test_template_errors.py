"""Chat template errors a client can read: ``chat_template_kwargs`` that would replace the conversation,
or that make the template fail, are a one-line 400 naming ``chat_template_kwargs`` with no Python or
jinja text in it; a template's own ``raise_exception`` message is still quoted. Real HTTP with the
official ``openai`` client against a model with a chat template."""

from __future__ import annotations

import pytest

pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from test_server import running_server  # noqa: E402

import s2d2  # noqa: E402
from s2d2.serving.app import create_app  # noqa: E402
from tool_fixtures import make_sdar_tool_model  # noqa: E402

TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tool turns here') }}{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if greeting %}{{ greeting.upper() }}{% endif %}<|im_start|>assistant\n"
)
CHAT = [{"role": "user", "content": "hello"}]
INTERNALS = ("Traceback", "jinja", "object", "attribute", "line ", ".py", "TypeError", "Undefined")


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    path = make_sdar_tool_model(tmp_path_factory.mktemp("templated"), template=TEMPLATE)
    model = s2d2.load(path, device="cpu", dtype="fp32", max_num_seqs=2)
    with running_server(create_app(model)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        client.name = client.models.list().data[0].id
        yield client


def _refusal(client, **extra):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=client.name, messages=CHAT, max_tokens=2, extra_body=extra)
    body = err.value.body
    assert "\n" not in body["message"] and not any(w in body["message"] for w in INTERNALS), body
    return body


@pytest.mark.parametrize("key", ["messages", "conversation"])
def test_kwargs_that_replace_the_conversation_are_a_400(client, key):
    body = _refusal(client, chat_template_kwargs={key: 5})
    assert body["param"] == "chat_template_kwargs" and key in body["message"]


def test_kwargs_the_template_fails_on_are_a_400_naming_them(client):
    ok = client.chat.completions.create(
        model=client.name,
        messages=CHAT,
        max_tokens=2,
        extra_body={"chat_template_kwargs": {"greeting": "hi"}},
    )
    assert ok.choices[0].finish_reason in ("stop", "length")
    body = _refusal(client, chat_template_kwargs={"greeting": 5})
    assert body["param"] == "chat_template_kwargs" and "greeting" in body["message"]


def test_the_templates_own_message_is_still_quoted(client):
    tool = {"role": "tool", "content": "1", "tool_call_id": "c"}
    turns = [*CHAT, {"role": "assistant", "content": "x"}, tool]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=client.name, messages=turns, max_tokens=2)
    assert err.value.body["param"] == "messages" and "no tool turns here" in err.value.body["message"]
