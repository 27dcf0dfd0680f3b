"""Agent frameworks' own loops against a real ``s2d2 serve`` app on 127.0.0.1 (a random SDAR model with the
Hermes template, tests/tool_fixtures.py), each to two tool rounds (call, result, call, result) and a final
answer, with the frameworks' default settings (parallel calls allowed, no decoding settings):

- LangGraph's ``create_react_agent`` over LangChain's ``ChatOpenAI`` (Chat Completions), invoked and
  streamed;
- the OpenAI Agents SDK with tools and an ``output_type``, on Chat Completions and on Responses;
- pydantic-ai with tools and ``NativeOutput``;
- the official ``anthropic`` SDK's ``messages.create`` and ``messages.stream`` on ``/v1/messages``.

A random model must be told to call: each loop names the tool of its round through the framework's own
per-round ``tool_choice`` (named: ``paint``, then ``tag``) and, for the final answer, either ``none`` or
the default ``auto``. Under ``auto`` with an output type the request carries ``response_format`` with
``tools`` (one constraint: calls or the schema's answer); a random model left free there calls for ever,
so that round favours the answer's first token (:func:`_step`). Every call a framework runs is
validated by the framework against the tool's schema before the tool runs."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

import pytest

pytest.importorskip("xgrammar")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from pydantic import BaseModel, Field  # noqa: E402
from test_server import running_server  # noqa: E402

import s2d2  # noqa: E402
from s2d2.serving.app import create_app  # noqa: E402
from tool_fixtures import make_sdar_tool_model  # noqa: E402

ROUNDS = ("paint", "tag")
NAME = "s2d2-tools"
#: Tokens per reply: a call of these tools fits; a final text answer may be cut (it still ends the loop).
MAX_TOKENS = 96


class Report(BaseModel):
    """The final answer of the loops with an output type."""

    status: Literal["done", "failed"]


Tags = Annotated[list[Literal["a", "bb"]], Field(min_length=1, max_length=3)]
Color = Literal["red", "blue", "green"]


def _choice(done: int, final: str) -> str:
    return ROUNDS[done] if done < len(ROUNDS) else final


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return s2d2.load(make_sdar_tool_model(tmp_path_factory.mktemp("loops")), device="cpu", dtype="fp32")


@pytest.fixture(scope="module")
def base(model):
    with running_server(create_app(model, max_num_seqs=4, served_name=NAME)) as url:
        yield url


def _step(model, choice: str) -> dict:
    """The extra body of a round: under ``auto`` a random model would call for ever, so the final round
    favours the token ``{`` (``s2d2.logit_bias``), which only the answer's JSON can start: the
    constraint still offers the calls, and the model answers in the output's schema instead."""
    if choice != "auto":
        return {}
    return {"s2d2": {"logit_bias": {str(model.tokenizer.convert_tokens_to_ids("{")): 100.0}}}


# ------------------------------------------------------------------------------------------- LangGraph
@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
@pytest.mark.parametrize("streamed", [False, True], ids=["invoke", "stream"])
def test_langgraph_react_agent(base, streamed):
    pytest.importorskip("langgraph")
    lc_openai = pytest.importorskip("langchain_openai")
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    calls = []

    @tool
    def paint(color: Color, ok: bool) -> str:
        """Paint the thing."""
        calls.append("paint")
        return f"painted {color}"

    @tool
    def tag(tags: Tags) -> str:
        """Tag the thing."""
        calls.append("tag")
        return "tagged"

    llm = lc_openai.ChatOpenAI(
        model=NAME, base_url=base + "/v1", api_key="none", max_tokens=MAX_TOKENS, max_retries=0, timeout=120
    )

    def model(state, runtime):  # LangGraph's dynamic model: the tool choice of this round
        done = sum(isinstance(m, ToolMessage) for m in state["messages"])
        return llm.bind_tools([paint, tag], tool_choice=_choice(done, "none"))

    agent = create_react_agent(model, [paint, tag])
    question = {"messages": [("user", "paint it and tag it")]}
    config = {"recursion_limit": 12}
    if streamed:  # the model's replies streamed (messages mode); the last values chunk is the final state
        result, chunks = None, 0
        for mode, chunk in agent.stream(question, config, stream_mode=["messages", "values"]):
            chunks += mode == "messages"
            result = chunk if mode == "values" else result
        assert chunks > 2
    else:
        result = agent.invoke(question, config)
    assert calls == list(ROUNDS)
    messages = result["messages"]
    assert [type(m).__name__ for m in messages[1:]] == ["AIMessage", "ToolMessage"] * 2 + ["AIMessage"]
    assert [m.tool_calls[0]["name"] for m in messages[1:4:2]] == list(ROUNDS)
    assert isinstance(messages[-1], AIMessage) and not messages[-1].tool_calls


# ---------------------------------------------------------------------------------- OpenAI Agents SDK
def _agents_model(agents, model, kind: str, final: str):
    """The SDK's model class for ``kind`` whose ``tool_choice`` names the tool of the current round."""
    base = agents.OpenAIResponsesModel if kind == "responses" else agents.OpenAIChatCompletionsModel

    class PerRound(base):
        async def get_response(self, system_instructions, input, model_settings, *args, **kwargs):
            items = input if isinstance(input, list) else []
            done = sum(1 for i in items if isinstance(i, dict) and i.get("type") == "function_call_output")
            choice = _choice(done, final)
            extra = _step(model, choice)
            step = agents.ModelSettings(tool_choice=choice, max_tokens=MAX_TOKENS, extra_body=extra or None)
            settings = model_settings.resolve(step)
            return await super().get_response(system_instructions, input, settings, *args, **kwargs)

    return PerRound


@pytest.mark.parametrize("final", ["none", "auto"])
@pytest.mark.parametrize("kind", ["chat", "responses"])
def test_openai_agents_sdk_with_output_type(model, base, kind, final):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    calls = []

    @agents.function_tool
    def paint(color: Color, ok: bool) -> str:
        """Paint the thing."""
        calls.append("paint")
        return f"painted {color}"

    @agents.function_tool
    def tag(tags: Tags) -> str:
        """Tag the thing."""
        calls.append("tag")
        return "tagged"

    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
    agent = agents.Agent(
        name="painter",
        instructions="Paint, then tag, then report.",
        tools=[paint, tag],
        model=_agents_model(agents, model, kind, final)(model=NAME, openai_client=client),
        output_type=Report,
        reset_tool_choice=False,
    )
    result = asyncio.run(agents.Runner.run(agent, "paint it and tag it", max_turns=6))
    assert calls[:2] == list(ROUNDS)
    made = [i.raw_item for i in result.new_items if i.type == "tool_call_item"]
    assert [m.name for m in made][:2] == list(ROUNDS)
    assert isinstance(result.final_output, Report)


# ------------------------------------------------------------------------------------------ pydantic-ai
@pytest.mark.parametrize("final", ["none", "auto"])
def test_pydantic_ai_with_native_output(model, base, final):
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.messages import ToolReturnPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    class PerRound(AbstractCapability):
        """The tool choice of each step (pydantic-ai's per-step model settings)."""

        def get_model_settings(self):
            def settings(ctx):
                parts = [p for m in ctx.messages for p in getattr(m, "parts", [])]
                done = sum(isinstance(p, ToolReturnPart) for p in parts)
                choice = _choice(done, final)
                named = [choice] if choice in ROUNDS else choice
                return {"tool_choice": named, "max_tokens": MAX_TOKENS, "extra_body": _step(model, choice)}

            return settings

    calls = []

    def paint(color: Color, ok: bool) -> str:
        """Paint the thing."""
        calls.append("paint")
        return f"painted {color}"

    def tag(tags: Tags) -> str:
        """Tag the thing."""
        calls.append("tag")
        return "tagged"

    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
    chat_model = OpenAIChatModel(NAME, provider=OpenAIProvider(openai_client=client))
    agent = Agent(chat_model, output_type=NativeOutput(Report), tools=[paint, tag], capabilities=[PerRound()])
    result = agent.run_sync("paint it and tag it")
    assert calls[:2] == list(ROUNDS)
    assert isinstance(result.output, Report)
    returns = [p for m in result.all_messages() for p in m.parts if isinstance(p, ToolReturnPart)]
    assert [r.tool_name for r in returns][:2] == list(ROUNDS)


# ------------------------------------------------------------------------------------- anthropic SDK
def _paint_or_tag(name: str, args: dict) -> str:
    """The tools of the Anthropic loop, their input checked against their schemas."""
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(args, ANTHROPIC_TOOLS[0 if name == "paint" else 1]["input_schema"])
    return f"{name} done"


PAINT = {"color": {"enum": ["red", "blue", "green"]}, "ok": {"type": "boolean"}}
TAG = {"tags": {"type": "array", "items": {"enum": ["a", "bb"]}, "minItems": 1, "maxItems": 3}}
ANTHROPIC_TOOLS = [
    {
        "name": "paint",
        "description": "Paint the thing.",
        "input_schema": {"type": "object", "properties": PAINT, "required": ["color", "ok"]},
    },
    {
        "name": "tag",
        "description": "Tag the thing.",
        "input_schema": {"type": "object", "properties": TAG, "required": ["tags"]},
    },
]


@pytest.mark.parametrize("streamed", [False, True], ids=["create", "stream"])
def test_anthropic_sdk_tool_loop(base, streamed):
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=base, api_key="none", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "paint it and tag it"}]
    used = []
    for _ in range(5):  # bounded: two forced rounds, then auto until a reply calls nothing
        name = _choice(len(used), "auto")
        choice = {"type": "tool", "name": name} if name in ROUNDS else {"type": name}
        kw = dict(
            model=NAME, max_tokens=MAX_TOKENS, tools=ANTHROPIC_TOOLS, tool_choice=choice, messages=messages
        )
        if streamed:
            with client.messages.stream(**kw) as stream:
                reply = stream.get_final_message()
        else:
            reply = client.messages.create(**kw)
        calls = [b for b in reply.content if b.type == "tool_use"]
        assert (reply.stop_reason == "tool_use") == bool(calls)
        if not calls:
            break
        messages.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}
        )
        results = [
            {"type": "tool_result", "tool_use_id": c.id, "content": _paint_or_tag(c.name, c.input)}
            for c in calls
        ]
        messages.append({"role": "user", "content": results})
        used += [c.name for c in calls]
    assert used[:2] == list(ROUNDS) and not calls
