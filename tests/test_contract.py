"""The contract table (``app.contract``) against the OpenAI SDK 3.57 it describes, and the README's
copy of it: a field the SDK adds, or one the README lost, fails here."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

from openai.types.responses import Response, ResponseIncludable
from openai.types.responses.response_create_params import (
    ResponseCreateParamsBase,
    ResponseCreateParamsStreaming,
)
from openai.types.responses.service_tier import ServiceTier
from openai.types.shared.reasoning_effort import ReasoningEffort

from app.contract import (
    EFFORTS,
    INCLUDES,
    PARAMETERS,
    RESPONSE_FIELDS,
    SERVICE_TIERS,
    markdown_table,
)
from app.wire import CreateResponse
from domain import prompt

README = Path(__file__).resolve().parents[1] / "README.md"


def _literal_values(alias: Any) -> list[str]:
    return [
        v
        for arg in typing.get_args(alias)
        for v in (typing.get_args(arg) or [arg])
        if isinstance(v, str)
    ]


def test_every_field_of_the_sdks_create_params_is_in_the_table() -> None:
    sdk = set(ResponseCreateParamsBase.__annotations__) | set(
        ResponseCreateParamsStreaming.__annotations__
    )
    table = {p.name for p in PARAMETERS if p.sdk}
    assert sdk - table == set(), "SDK fields missing from app.contract.PARAMETERS"
    assert table - sdk == set(), "marked as SDK fields but not in the SDK"
    assert len({p.name for p in PARAMETERS}) == len(PARAMETERS)
    assert all(p.note and p.handling in ("honoured", "hint", "refused") for p in PARAMETERS)


def test_every_field_the_wire_model_reads_is_in_the_table_and_not_refused() -> None:
    handling = {p.name: p.handling for p in PARAMETERS}
    for name in CreateResponse.model_fields:
        assert handling.get(name) in ("honoured", "hint"), name


def test_the_readme_holds_the_table() -> None:
    text = README.read_text()
    assert "## Request parameters" in text
    assert markdown_table() in text, "README's table differs from app.contract.markdown_table()"
    for parameter in PARAMETERS:
        assert f"| `{parameter.name}`" in text


def test_the_value_lists_are_the_sdks() -> None:
    assert list(EFFORTS) == _literal_values(ReasoningEffort)
    assert list(SERVICE_TIERS) == _literal_values(ServiceTier)
    assert set(INCLUDES) == set(_literal_values(ResponseIncludable))
    assert set(RESPONSE_FIELDS) == set(Response.model_fields)


def test_every_effort_renders_at_the_documented_harmony_level() -> None:
    for effort, level in EFFORTS.items():
        assert prompt._EFFORTS[effort].name.lower() == level, effort
