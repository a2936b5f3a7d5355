"""The zstd dictionary compressed values are written with (type suffix ``+zstd``).

Never edit these bytes: every value stored ``+zstd`` needs exactly them to be read back. A
better dictionary is a new constant with a new suffix (``+zstd2``), read alongside this one.

Raw content, not a trained dictionary: the skeletons of what the faithful codec writes for
LangChain's messages and tool calls, so that even a short chat message compresses well.
"""

from __future__ import annotations

from typing import Final

__all__ = ["ZSTD_DICTIONARY_1"]

ZSTD_DICTIONARY_1: Final = (
    b'{"~lc":[["langchain","schema","messages","SystemMessage"],{"content":"",'
    b'"additional_kwargs":{},"response_metadata":{},"type":"system","name":null,"id":null}]}'
    b'{"~lc":[["langchain","schema","messages","ToolMessage"],{"content":"",'
    b'"additional_kwargs":{},"response_metadata":{},"type":"tool","name":null,"id":"",'
    b'"tool_call_id":"","artifact":null,"status":"success"}]}'
    b'{"~lc":[["langchain","schema","messages","HumanMessage"],{"content":"",'
    b'"additional_kwargs":{},"response_metadata":{},"type":"human","name":null,"id":""}]}'
    b'{"~lc":[["langchain","schema","messages","AIMessage"],{"content":"",'
    b'"additional_kwargs":{"refusal":null},"response_metadata":{"token_usage":{},'
    b'"model_name":"","system_fingerprint":null,"finish_reason":"stop","logprobs":null},'
    b'"type":"ai","name":null,"id":"","tool_calls":[{"name":"","args":{},"id":"",'
    b'"type":"tool_call"}],"invalid_tool_calls":[],"usage_metadata":{"input_tokens":0,'
    b'"output_tokens":0,"total_tokens":0,"input_token_details":{},"output_token_details":{}}}]}'
)
