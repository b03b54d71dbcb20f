"""OpenAI-shaped errors, and the one place where every layer's errors become HTTP answers.

Every error a client sees is ``{"error": {"message", "type", "param", "code"}}`` with the status
OpenAI uses: 400 for a bad request, 404 for an unknown response or model, 409 for a conflicting
state, 413 for an oversized body, 500/503 for our own failures. Nothing escapes as a bare 500.
"""

from __future__ import annotations

import logging

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse

from app.engines.protocol import EngineError, PromptTooLong
from domain.errors import InvalidInput
from persistence.errors import ConcurrencyError, NotFound, StoreUnavailable

__all__ = ["RETRY_AFTER_S", "APIError", "error_body", "handle_exception", "not_found", "validation_error"]

log = logging.getLogger(__name__)

#: What a client told the database is unavailable should wait before trying again (seconds).
RETRY_AFTER_S = 2


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers


def not_found(what: str, ident: str, *, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(404, f"{what} with id '{ident}' not found.", param=param, code=code)


def error_body(message: str, type: str, param: str | None, code: str | None) -> dict[str, object]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _loc_to_param(loc: tuple[object, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before", "function-plain", "function-wrap"):
            continue
        elif isinstance(part, str) and ("[" in part or "(" in part or part in ("str", "list", "dict", "tagged-union")):
            continue  # pydantic's union-member labels
        else:
            out += f".{part}" if out else str(part)
    return out


def validation_error(exc: ValidationError) -> APIError:
    first = exc.errors()[0]
    param = _loc_to_param(tuple(first.get("loc", ())))
    message = first.get("msg", "Invalid value")
    if first.get("type") == "missing":
        message = f"Missing required parameter: '{param}'."
    elif first.get("type") == "extra_forbidden":
        message = f"Unknown parameter: '{param}'."
    else:
        message = f"Invalid value for '{param}': {message}."
    code = "missing_required_parameter" if first.get("type") == "missing" else "invalid_value"
    return APIError(400, message, param=param or None, code=code)


def to_api_error(exc: Exception) -> APIError:
    match exc:
        case APIError():
            return exc
        case ValidationError():
            return validation_error(exc)
        case InvalidInput():
            return APIError(400, exc.message, param=exc.param, code=exc.code)
        case PromptTooLong():
            return APIError(400, str(exc), param="input", code="context_length_exceeded")
        case EngineError():
            return APIError(400, str(exc), param="input", code="invalid_prompt")
        case NotFound():
            return APIError(404, str(exc) or "Not found.")
        case ConcurrencyError():
            return APIError(409, f"Conflicting write: {exc}", code="conflict")
        case StoreUnavailable():
            # the database is away (down, frozen, read-only, full): come back shortly
            return APIError(
                503,
                f"The service cannot store responses right now ({exc.reason}); retry later.",
                type="server_error",
                code="store_unavailable",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        case _:  # our own failure (a broken invariant, the store, a bug): logged, never leaked
            log.exception("unhandled error")
            return APIError(500, "The server had an error while processing your request.", type="server_error")


async def handle_exception(request: Request, exc: Exception) -> JSONResponse:
    err = to_api_error(exc)
    return JSONResponse(
        error_body(err.message, err.type, err.param, err.code), status_code=err.status, headers=err.headers
    )
