"""A real agent framework over HTTP (issue 61): the OpenAI Agents SDK's own agent loop against ``s2d2
serve``'s app on 127.0.0.1, on its default Responses model and on its Chat Completions model, streamed and
not. Two tool rounds (call, result, call, result) and a final answer (the agent's ``output_type``, sent
as ``text.format`` / ``response_format`` json_schema, so the random model's last reply ends): a random
model must be told to call, so the model wrapper names the tool of each round (``tool_choice`` named,
then ``none``); every call the SDK runs parses and validates against the tool's schema (the SDK's own
validation, and jsonschema)."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Literal

import pytest

pytest.importorskip("xgrammar")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
agents = pytest.importorskip("agents")
jsonschema = pytest.importorskip("jsonschema")

from pydantic import BaseModel, Field  # noqa: E402
from test_server import running_server  # noqa: E402

import s2d2  # noqa: E402
from s2d2.serving.app import create_app  # noqa: E402
from tool_fixtures import make_sdar_tool_model  # noqa: E402

ROUNDS = ("paint", "tag")


class Report(BaseModel):
    """The agent's final answer (its JSON schema constrains the last reply, which then ends)."""

    status: Literal["done", "failed"]


def _rounds_done(items) -> int:
    return sum(1 for i in items if isinstance(i, dict) and i.get("type") == "function_call_output")


def scripted(base):
    """``base`` (an SDK model class) whose ``tool_choice`` names the tool of the current round."""

    class Scripted(base):
        def _settings(self, items, settings):
            done = _rounds_done(items if isinstance(items, list) else [])
            choice = ROUNDS[done] if done < len(ROUNDS) else "none"
            return settings.resolve(agents.ModelSettings(tool_choice=choice, max_tokens=96))

        async def get_response(self, system_instructions, input, model_settings, *args, **kwargs):
            settings = self._settings(input, model_settings)
            return await super().get_response(system_instructions, input, settings, *args, **kwargs)

        def stream_response(self, system_instructions, input, model_settings, *args, **kwargs):
            settings = self._settings(input, model_settings)
            return super().stream_response(system_instructions, input, settings, *args, **kwargs)

    return Scripted


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    agents.set_tracing_disabled(True)
    model = s2d2.load(make_sdar_tool_model(tmp_path_factory.mktemp("agent")), device="cpu", dtype="fp32")
    with running_server(create_app(model, max_num_seqs=4, served_name="s2d2-tools")) as base:
        yield base + "/v1"


def _agent(base_url, kind, calls):
    @agents.function_tool
    def paint(color: Literal["red", "blue", "green"], ok: bool) -> str:
        """Paint the thing."""
        calls.append(("paint", color, ok))
        return f"painted {color}"

    @agents.function_tool
    def tag(tags: Annotated[list[Literal["a", "bb"]], Field(min_length=1, max_length=3)]) -> str:
        """Tag the thing."""
        calls.append(("tag", tags))
        return "tagged"

    client = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120)
    cls = agents.OpenAIResponsesModel if kind == "responses" else agents.OpenAIChatCompletionsModel
    model = scripted(cls)(model="s2d2-tools", openai_client=client)
    agent = agents.Agent(
        name="painter",
        instructions="Paint, then tag, then say done.",
        tools=[paint, tag],
        model=model,
        model_settings=agents.ModelSettings(tool_choice="auto"),
        output_type=Report,
        reset_tool_choice=False,
    )
    return agent, {"paint": paint.params_json_schema, "tag": tag.params_json_schema}


async def _run(agent, streamed):
    if not streamed:
        return await agents.Runner.run(agent, "paint it and tag it", max_turns=5)
    result = agents.Runner.run_streamed(agent, "paint it and tag it", max_turns=5)
    async for _ in result.stream_events():
        pass
    return result


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", ["responses", "chat"])
def test_agent_loop_of_two_tool_rounds(base_url, kind, streamed):
    calls = []
    agent, schemas = _agent(base_url, kind, calls)
    result = asyncio.run(_run(agent, streamed))
    assert [c[0] for c in calls] == list(ROUNDS)
    made = [i.raw_item for i in result.new_items if i.type == "tool_call_item"]
    assert [getattr(m, "name", None) for m in made] == list(ROUNDS)
    for m in made:
        jsonschema.validate(json.loads(m.arguments), schemas[m.name])
    assert isinstance(result.final_output, Report)
    assert result.new_items[-1].type == "message_output_item"
