"""Agent frameworks on POST /v1/responses against the real server (bundled model): the
OpenAI Agents SDK's default model, LangChain's ChatOpenAI(use_responses_api=True) and
pydantic-ai's OpenAIResponsesModel each run a tool-calling turn. The tiny model is made
to call the tool with tool_choice on the first step; each test checks the tool ran with
the declared argument name and that a final answer came back."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import openai
import pytest

from .conftest import API_KEY, MODEL

INSTRUCTIONS = "Use the get_weather tool to answer, then answer in one short sentence."
QUESTION = "What is the weather in Paris?"
WEATHER = "Sunny, 21 C"


def _async_client(server: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server}/v1", api_key=API_KEY, max_retries=0)


def test_openai_agents_sdk(server):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    seen: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        seen.append(city)
        return WEATHER

    model = agents.OpenAIResponsesModel(model=MODEL, openai_client=_async_client(server))
    agent = agents.Agent(
        name="weather",
        instructions=INSTRUCTIONS,
        tools=[get_weather],
        model=model,
        # required on the first turn; the SDK resets tool_choice after a call (its default)
        model_settings=agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=48),
    )
    result = asyncio.run(agents.Runner.run(agent, QUESTION, max_turns=4))
    assert len(seen) >= 1 and all(isinstance(c, str) for c in seen)
    assert isinstance(result.final_output, str) and result.final_output.strip()
    calls = [i for i in result.new_items if i.type == "tool_call_item"]
    assert calls and calls[0].raw_item.name == "get_weather"


def test_langchain_chat_openai_responses(server):
    lc = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return WEATHER

    llm = lc.ChatOpenAI(
        model=MODEL,
        base_url=f"{server}/v1",
        api_key=API_KEY,
        use_responses_api=True,
        temperature=0,
        max_tokens=48,
        max_retries=0,
    )
    messages = [SystemMessage(INSTRUCTIONS), HumanMessage(QUESTION)]
    ai = llm.bind_tools([get_weather], tool_choice="required").invoke(messages)
    (call,) = ai.tool_calls
    assert call["name"] == "get_weather" and set(call["args"]) == {"city"}
    result = get_weather.invoke(call["args"])
    messages += [ai, ToolMessage(result, tool_call_id=call["id"])]
    final = llm.bind_tools([get_weather], tool_choice="none").invoke(messages)
    assert final.text.strip() and not final.tool_calls
    # Streaming through the same path gives the same answer.
    streamed = "".join(
        c.text for c in llm.bind_tools([get_weather], tool_choice="none").stream(messages)
    )
    assert streamed == final.text


def test_pydantic_ai_responses_model(server):
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent, RunContext
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    @dataclass
    class ToolFirst(AbstractCapability):
        """tool_choice required on the first model request only."""

        def get_model_settings(self):
            def settings(ctx: RunContext):
                return {"tool_choice": "required"} if ctx.run_step <= 1 else {}

            return settings

    seen: list[str] = []
    model = OpenAIResponsesModel(
        MODEL, provider=OpenAIProvider(openai_client=_async_client(server))
    )
    agent = Agent(
        model,
        instructions=INSTRUCTIONS,
        model_settings={"temperature": 0, "max_tokens": 48},
        capabilities=[ToolFirst()],
    )

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        seen.append(city)
        return WEATHER

    result = asyncio.run(agent.run(QUESTION))
    assert len(seen) >= 1 and all(isinstance(c, str) for c in seen)
    assert isinstance(result.output, str) and result.output.strip()
