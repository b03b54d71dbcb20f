"""``POST /v1/responses/input_tokens``: how many tokens a request's prompt would have.

The count is the length of the very prompt ``POST /v1/responses`` would send to the engine: the
body is checked by the same contract and wire model, its ``previous_response_id`` chain and item
references are resolved for the caller's project, and it is rendered by the same code
(:meth:`~app.service.ResponseService.prompt`, ``truncation: "auto"`` included: the count is
of what is left), with the same checks a create makes before it
generates (``text.format`` must compile, the prompt must fit the context window: what create
would refuse, this refuses with the same 400). Nothing is generated or stored.

The body takes the fields of the SDK's ``InputTokenCountParams``; ``model`` may be left out (the
first served model then). ``personality`` has no counterpart in gpt-oss's prompt format and is
refused; ``conversation`` is handled as create handles it.
"""

from __future__ import annotations

from typing import Any

from app.contract import check_request
from app.conversations import conversation_param
from app.errors import APIError, unknown_parameter
from app.service import ResponseService
from app.wire import CreateResponse

__all__ = ["FIELDS", "count"]

#: The body fields of openai-python 3.57's ``InputTokenCountParams``.
FIELDS = frozenset(
    {
        "conversation",
        "input",
        "instructions",
        "model",
        "parallel_tool_calls",
        "personality",
        "previous_response_id",
        "reasoning",
        "text",
        "tool_choice",
        "tools",
        "truncation",
    }
)


async def count(service: ResponseService, body: dict[str, Any], *, project: str) -> dict[str, Any]:
    """OpenAI's ``response.input_tokens`` object for ``body``."""
    for name in body:
        if name not in FIELDS:
            raise unknown_parameter(name)
    if body.get("personality") is not None:
        raise APIError(
            400,
            "'personality' is not supported by this server: gpt-oss's prompt format has no "
            "personality presets; write the tone you want into `instructions`.",
            param="personality",
            code="unsupported_parameter",
        )
    fields = {name: value for name, value in body.items() if name != "personality"}
    check_request(fields)
    model = fields.get("model")
    if (
        model is None
    ):  # left out: the first served model (anything else is the wire model's to check)
        model = service.model_names()[0]
    request = CreateResponse.model_validate({**fields, "model": model, "store": False})
    service.resolve_model(request.model)
    conversation = conversation_param(
        getattr(request, "conversation", None), request.previous_response_id
    )
    _, rendered, _ = await service.prompts.prompt(request, project, conversation)
    prompt_len = len(rendered.token_ids)
    service.prompts.sampling(
        request, rendered, prompt_len
    )  # create's last checks: context window, text.format
    return {"object": "response.input_tokens", "input_tokens": prompt_len}
