"""OpenAI-shaped errors, and the one place where every layer's errors become HTTP answers.

Every error a client sees is ``{"error": {"message", "type", "param", "code"}}`` with the status
OpenAI uses: 400 for a bad request, 404 for an unknown response or model, 409 for a conflicting
state, 413 for an oversized body, 500/503 for our own failures. Nothing escapes as a bare 500.

Every route is wrapped in :func:`guard`, which turns whatever it raises into an
:class:`APIError`, answered by Starlette's ``ExceptionMiddleware``. An exception no handler is
registered for went on to ``ServerErrorMiddleware``, which answers and then re-raises; uvicorn
then dropped the keep-alive connection without ``Connection: close``, and the client's next
request on it failed. Exceptions that do not derive from ``Exception`` (a Rust panic in
openai-harmony is pyo3's ``PanicException``, a ``BaseException``) passed every handler and
uvicorn answered them in text/plain. Now an unexpected error is logged once, with its traceback,
and answered as an OpenAI-shaped 500 on a connection that stays usable.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app.engines.protocol import EngineError, PromptTooLong
from domain.errors import InvalidInput
from persistence.errors import ConcurrencyError, NotFound, StoreUnavailable

__all__ = [
    "RETRY_AFTER_S",
    "APIError",
    "error_body",
    "guard",
    "handle_exception",
    "not_found",
    "param_text",
    "validation_error",
]

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


def not_found(
    what: str, ident: str, *, param: str | None = None, code: str | None = None
) -> APIError:
    return APIError(404, f"{what} with id '{ident}' not found.", param=param, code=code)


def unknown_parameter(name: str) -> APIError:
    """OpenAI's 400 for a parameter it does not know (a body's top-level field, a query's name)."""
    return APIError(
        400, f"Unrecognized request argument supplied: {name}", param=name, code="unknown_parameter"
    )


def error_body(message: str, type: str, param: str | None, code: str | None) -> dict[str, object]:
    return {
        "error": {
            "message": _encodable(message),
            "type": type,
            "param": _encodable(param),
            "code": code,
        }
    }


def _encodable(text: str | None) -> str | None:
    """``text`` as UTF-8 can carry it: a lone surrogate (from a client's text echoed in a
    message) is written as its escape instead of failing the answer's encoding."""
    if text is None:
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def param_text(path: Sequence[str | int]) -> str:
    """A JSON path as ``param`` names it: ``tools[3].parameters.properties.x``. Keys that are
    not printable are escaped and long ones clipped, so the answer stays readable and encodable."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        name = part if part.isprintable() else ascii(part)[1:-1]
        if len(name) > 64:
            name = name[:61] + "..."
        out += f".{name}" if out else name
    return out


def _loc_to_param(loc: tuple[object, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before", "function-plain", "function-wrap"):
            continue
        elif isinstance(part, str) and (
            "[" in part or "(" in part or part in ("str", "list", "dict", "tagged-union")
        ):
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
            return APIError(
                500, "The server had an error while processing your request.", type="server_error"
            )


async def handle_exception(request: Request, exc: Exception) -> JSONResponse:
    err = to_api_error(exc)
    return JSONResponse(
        error_body(err.message, err.type, err.param, err.code),
        status_code=err.status,
        headers=err.headers,
    )


class InternalError(Exception):
    """A ``BaseException`` that is not an ``Exception`` (a Rust panic) raised in a route."""


#: Never turned into an answer: they stop the request (a cancelled task, a stopping process).
_PASS_THROUGH = (asyncio.CancelledError, KeyboardInterrupt, SystemExit, GeneratorExit)


def guard(
    endpoint: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """``endpoint`` with everything it raises, but cancellation and exit, raised as the
    :class:`APIError` that answers it (an unexpected one logged here, with its traceback);
    exceptions that have a handler of their own in ``create_app`` are left to it."""

    @functools.wraps(endpoint)
    async def guarded(request: Request) -> Response:
        try:
            return await endpoint(request)
        except _PASS_THROUGH:
            raise
        except Exception as exc:
            if _has_handler(request, exc):
                raise  # answered by its own handler (registered in app.main), as before
            raise to_api_error(exc) from exc
        except BaseException as exc:
            name = f"{type(exc).__module__}.{type(exc).__qualname__}"
            raise to_api_error(InternalError(f"{name}: {exc}")) from exc

    return guarded


def _has_handler(request: Request, exc: Exception) -> bool:
    """Whether ``ExceptionMiddleware`` has a handler for ``exc`` (the ``Exception`` one
    belongs to ``ServerErrorMiddleware``, which re-raises, so it does not count)."""
    handlers, _ = request.scope.get("starlette.exception_handlers", ({}, {}))
    return any(cls in handlers for cls in type(exc).__mro__ if cls is not Exception)
