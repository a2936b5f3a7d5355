"""A scripted chat model and a tool-calling agent for the turn tests.

:class:`ScriptedChatModel` is a real ``BaseChatModel``: LangChain's callbacks, ``invoke`` and
``ainvoke`` run as for any provider's model. Each call answers with the next entry of its
script (an ``AIMessage``, or a function of the prompt that returns one) and records the
prompt it was given, so a test can check what the model was told.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import PrivateAttr

Step = AIMessage | Callable[[list[BaseMessage]], AIMessage]


class ScriptedChatModel(BaseChatModel):
    """Answers each call with the next step of ``script``; records every prompt."""

    script: list[Any]
    _calls: int = PrivateAttr(default=0)
    _prompts: list[list[BaseMessage]] = PrivateAttr(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    @property
    def prompts(self) -> list[list[BaseMessage]]:
        return self._prompts

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self._prompts.append(list(messages))
        step = self.script[min(self._calls, len(self.script) - 1)]
        self._calls += 1
        message = step(list(messages)) if callable(step) else step
        return ChatResult(generations=[ChatGeneration(message=message.model_copy())])

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self


_ids = itertools.count()


def call(name: str, call_id: str | None = None, **args: Any) -> dict[str, Any]:
    """One tool call as a model issues it."""
    return {"name": name, "args": args, "id": call_id or f"call-{next(_ids)}", "type": "tool_call"}


def calls(*tool_calls: dict[str, Any], text: str = "") -> AIMessage:
    """An assistant message calling ``tool_calls`` (in parallel, when several)."""
    return AIMessage(content=text, tool_calls=list(tool_calls))


def answer(text: str) -> AIMessage:
    return AIMessage(content=text)


def agent_graph(model: BaseChatModel, tools: Sequence[BaseTool], **tool_node: Any) -> StateGraph[Any]:
    """``agent`` (the model) and ``tools`` (LangGraph's ``ToolNode``) in a loop, as a builder."""

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.bind_tools(tools).invoke(state["messages"])]}

    async def aagent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.bind_tools(tools).ainvoke(state["messages"])]}

    from langchain_core.runnables import RunnableLambda

    builder = StateGraph(MessagesState)
    builder.add_node("agent", RunnableLambda(agent, afunc=aagent))
    builder.add_node("tools", ToolNode(list(tools), **tool_node))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder
