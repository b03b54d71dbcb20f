"""Wire models: what ``POST /v1/responses`` accepts, validated at the edge with pydantic.

Fields OpenAI documents are typed. Which top-level fields exist at all, and which values the
server refuses, is :mod:`app.contract`'s table, checked before this model reads the body (so
``extra="allow"`` here lets nothing unknown through). Input items are checked only for being JSON objects with a
``type`` or a ``role`` here: their shapes are checked by ``domain.prompt``, which knows every item
a client may send and answers with the exact parameter path when one is wrong.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.contract import SUPPORTED_TOOL_TYPES

__all__ = [
    "ITEMS_SCHEMA",
    "METADATA_SCHEMA",
    "CreateResponse",
    "Reasoning",
    "check_metadata",
    "list_page",
]

#: :func:`check_metadata`'s limits as JSON Schema, for the OpenAPI document (``app.openapi``):
#: each applies to an object only, so it sits beside a field's ``null`` alternative.
METADATA_SCHEMA: dict[str, Any] = {
    "maxProperties": 16,
    "propertyNames": {"maxLength": 64},
    "additionalProperties": {"type": "string", "maxLength": 512},
}
#: An array of input items as the edge checks them: objects with a ``type`` or a ``role`` (their
#: shapes are ``domain.prompt``'s to check).
ITEMS_SCHEMA: dict[str, Any] = {
    "items": {"type": "object", "anyOf": [{"required": ["type"]}, {"required": ["role"]}]}
}
#: An object with a string ``type`` (an object ``tool_choice``; a tool, of a type the server offers).
_TYPED: dict[str, Any] = {"required": ["type"], "properties": {"type": {"type": "string"}}}
_TOOL: dict[str, Any] = {
    "type": "object",
    "required": ["type"],
    "properties": {"type": {"enum": list(SUPPORTED_TOOL_TYPES)}},
}


def check_metadata(value: dict[str, str] | None) -> dict[str, str] | None:
    """OpenAI's metadata limits (a pydantic validator: ValueError names what is wrong)."""
    if value is not None:
        if len(value) > 16:
            raise ValueError("at most 16 metadata keys")
        for key, item in value.items():
            if len(key) > 64 or len(item) > 512:
                raise ValueError("metadata keys are at most 64 and values at most 512 characters")
    return value


def list_page(items: list[dict[str, Any]], *, has_more: bool) -> dict[str, Any]:
    """OpenAI's list object for one page of ``items`` (each with an ``id``)."""
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": has_more,
    }


class Reasoning(BaseModel):
    model_config = ConfigDict(extra="allow")
    #: Every value of the SDK's ``ReasoningEffort``; ``app.contract.EFFORTS`` says how each renders.
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: str | None = None


class CreateResponse(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]] = Field(default_factory=list, json_schema_extra=ITEMS_SCHEMA)
    instructions: str | None = None
    previous_response_id: str | None = None
    stream: bool = False
    store: bool = True
    background: bool = False
    tools: list[dict[str, Any]] = Field(default_factory=list, json_schema_extra={"items": _TOOL})
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] = Field(
        default="auto", json_schema_extra=_TYPED
    )
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    reasoning: Reasoning | None = None
    include: list[str] | None = None
    metadata: dict[str, str] | None = Field(default=None, json_schema_extra=METADATA_SCHEMA)
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    service_tier: str | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_tool_calls: int | None = Field(default=None, ge=1)
    stream_options: dict[str, Any] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)  # a 64-bit seed

    _metadata_limits = field_validator("metadata")(check_metadata)

    @field_validator("tools")
    @classmethod
    def _tools_have_types(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for index, tool in enumerate(value):
            if not isinstance(tool.get("type"), str):
                raise ValueError(f"tools[{index}] has no 'type'")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice_shape(cls, value: Any) -> Any:
        if isinstance(value, dict) and not isinstance(value.get("type"), str):
            raise ValueError("an object tool_choice needs a 'type'")
        return value

    @property
    def include_encrypted_reasoning(self) -> bool:
        return "reasoning.encrypted_content" in (self.include or [])
