"""Request-body checks done before a turn reaches the toolkit's adapters.

The adapters trust their input (a non-JSON body or ``max_tokens: "many"`` would surface as
a 500 mid-turn), so the gateway validates the fields they read, with the wire protocol's
own error shape, and refuses with 400 and a reason. Unknown fields pass through untouched:
the body handed to the adapter is the body the agent sent.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

Protocol = Literal["openai", "anthropic"]

_PositiveInt = Annotated[int, Field(strict=True, ge=1)]
_Temperature = Annotated[float, Field(strict=True, ge=0.0, le=2.0)]  # the sampling service accepts 0..2
_TopP = Annotated[float, Field(strict=True, gt=0.0, le=1.0)]
_TopK = Annotated[int, Field(strict=True, ge=-1)]
_Bool = Annotated[bool, Field(strict=True)]
_Str = Annotated[str, Field(strict=True)]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class OpenAIMessage(_Open):
    role: _Str
    content: _Str | list[dict[str, Any] | _Str] | None = None
    tool_calls: list[dict[str, Any]] | None = None


class OpenAIChatRequest(_Open):
    """The fields of ``POST /v1/chat/completions`` the OpenAI adapter reads."""

    messages: Annotated[list[OpenAIMessage], Field(min_length=1)]
    model: _Str | None = None
    max_tokens: _PositiveInt | None = None
    max_completion_tokens: _PositiveInt | None = None
    max_output_tokens: _PositiveInt | None = None
    temperature: _Temperature | None = None
    top_p: _TopP | None = None
    top_k: _TopK | None = None
    stop: _Str | list[_Str] | None = None
    stream: _Bool | None = None
    tools: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] | None = None


class AnthropicMessage(_Open):
    role: Literal["user", "assistant", "system"]
    content: _Str | list[dict[str, Any]]


class AnthropicMessagesRequest(_Open):
    """The fields of ``POST /v1/messages`` the Anthropic adapter reads."""

    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    model: _Str | None = None
    system: _Str | list[dict[str, Any]] | None = None
    max_tokens: _PositiveInt | None = None
    temperature: _Temperature | None = None
    top_p: _TopP | None = None
    top_k: _TopK | None = None
    stop_sequences: list[_Str] | None = None
    stream: _Bool | None = None
    tools: list[dict[str, Any]] | None = None


_MODELS: dict[str, type[BaseModel]] = {"openai": OpenAIChatRequest, "anthropic": AnthropicMessagesRequest}

#: route path -> protocol of the turn routes we guard.
TURN_ROUTES: dict[str, Protocol] = {"/v1/chat/completions": "openai", "/v1/messages": "anthropic"}


def parse_body(raw: bytes, protocol: Protocol) -> tuple[dict | None, str | None]:
    """``(body, None)`` if ``raw`` is a JSON object whose fields have the types the adapter
    reads, else ``(None, reason)``. The reason names the field and what is accepted."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"request body is not valid JSON: {e}"
    if not isinstance(body, dict):
        return None, f"request body must be a JSON object, got {type(body).__name__}"
    try:
        _MODELS[protocol].model_validate(body)
    except ValidationError as e:
        return None, "; ".join(_describe(err) for err in e.errors()[:5])
    return body, None


def _describe(err: dict) -> str:
    where = ".".join(str(p) for p in err.get("loc", ())) or "body"
    return f"{where}: {err.get('msg')}"


#: Refusals a retry cannot change (the session is unknown or over, the body is bad or too large, the
#: rollout's turn or token budget is spent): answered with ``x-should-retry: false``, the header the official
#: openai and anthropic Python clients obey before their own rules (which retry every 429), so an agent learns
#: at once that its rollout is over. 5xx answers ("retry") keep the clients' retries. A 429 from Lambda itself
#: (the function at its concurrency) never passes here and is still retried.
FINAL_STATUSES = frozenset({400, 401, 403, 404, 413, 429})


def error_response(protocol: Protocol, status: int, error_type: str, message: str) -> web.Response:
    """An error in the protocol's own shape (what the official clients parse); `FINAL_STATUSES` say not to retry."""
    if protocol == "anthropic":
        payload: dict = {"type": "error", "error": {"type": error_type, "message": message}}
    else:
        payload = {"error": {"message": message, "type": error_type, "param": None, "code": None}}
    headers = {"x-should-retry": "false"} if status in FINAL_STATUSES else None
    return web.json_response(payload, status=status, headers=headers)
