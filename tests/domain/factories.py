"""Plain factory functions for domain tests."""

from __future__ import annotations

import itertools
from typing import Any

from domain.builder import ResponseBuilder


def response_skeleton(response_id: str = "resp_test", **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": 1_700_000_000,
        "model": "gpt-oss-test",
        "instructions": None,
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_output_tokens": None,
        "previous_response_id": None,
        "metadata": {},
        "error": None,
        "incomplete_details": None,
        "usage": None,
        "background": False,
        "text": {"format": {"type": "text"}},
        "reasoning": {"effort": "medium", "summary": None},
        "truncation": "disabled",
        "store": True,
        "user": None,
        "safety_identifier": None,
        "prompt_cache_key": None,
        "service_tier": "auto",
    }
    base.update(overrides)
    return base


def counter_ids() -> Any:
    counter = itertools.count()
    return lambda prefix: f"{prefix}_{next(counter):04d}"


def make_builder(**overrides: Any) -> ResponseBuilder:
    return ResponseBuilder(response_skeleton(**overrides), new_id=counter_ids())
