"""The audit page: ``/ui``, server-rendered (Jinja2, ``app/templates/ui``), a little plain JavaScript.

- ``GET /ui``: the responses, newest first, filtered by status, model, project, creation time
  (UTC) and text (``persistence.listing``), 50 a page;
- ``GET /ui/responses/{id}``: one response: its timeline (seq over time, drawn in SVG from the
  commit times of its events), its input and output items, usage, the exact prompt as Harmony text
  with its token count, the output token ids, the chain (``previous_response_id``, both ways) and
  the conversation it belongs to, a replay button and a download of the log;
- ``GET /ui/responses/{id}/log.jsonl``: the log as JSON lines (``app.audit_log``, the format of
  ``responses-ledger events``);
- ``GET /ui/responses/{id}/stream?stream=true&starting_after=N``: the resume endpoint
  (``app.http.get_response``, the handler of ``GET /v1/responses/{id}?stream=true``) behind the
  page's gate. The replay button reads it and shows each event at its recorded time.

Who may look: everyone when the server runs without keys (as ``/v1`` then does); with keys,
admins only, by key. A browser cannot put a bearer key on a page it navigates to, so the page
takes HTTP Basic authentication (any user name, the key as the password; the browser asks for
it), or a bearer key from scripts. A member's key is 403. The replay reads the resume endpoint
under ``/ui`` rather than ``/v1`` because an admin audits every project's responses, while
``/v1`` shows a key only its own project's; the stream is the same bytes.

Everything shown is escaped by Jinja's autoescape (prompts and outputs are user data); the data
the script needs travels as JSON in a ``<script type="application/json">`` element, written
with ``tojson``, which escapes ``<``, ``>`` and ``&``.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import math
import statistics
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from app.audit_log import log_lines
from app.auth import serve_as
from app.errors import APIError, guard, handle_exception, not_found
from app.keys import OPEN_CALLER, Caller, KeyRing
from app.openapi import OPERATIONS, Query
from persistence.errors import NotFound, StoreError
from persistence.listing import ResponseQuery
from persistence.records import ResponseRow

__all__ = ["QUERIES", "AuditGate", "routes"]

PAGE_SIZE = 50
STATUSES = ("queued", "in_progress", "completed", "incomplete", "failed", "cancelled")
#: A gap between commits this long, or ten times the median gap if longer, is drawn as a pause.
PAUSE_MIN_S = 0.25
_REALM = 'Basic realm="responses-ledger audit", charset="UTF-8"'
_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
    }
)

_templates = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates") / "ui"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_templates.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False)


def _is_ui(path: str) -> bool:
    return path == "/ui" or path.startswith("/ui/")


class AuditGate:
    """``/ui`` for admins only when keys are required (see the module docstring); the caller
    found is put in the scope as ``app.auth.KeyAuth`` does for ``/v1``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _is_ui(scope["path"]):
            await self.app(scope, receive, send)
            return
        ring: KeyRing | None = getattr(scope["app"].state, "keys", None)
        try:
            caller = await _admin(ring, scope)
        except (APIError, StoreError) as exc:
            response: Any = await handle_exception(Request(scope, receive), exc)
            await response(scope, receive, send)
            return
        await serve_as(caller, self.app, scope, receive, send)


async def _admin(ring: KeyRing | None, scope: Scope) -> Caller:
    if ring is None:
        raise APIError(503, "The server is starting.", type="server_error")
    if not ring.required:
        return OPEN_CALLER
    presented = _presented_key(scope)
    caller = await ring.authenticate(presented) if presented else None
    if caller is None:
        raise APIError(
            401,
            "The audit page needs an admin API key: sign in with any user name and the key as "
            "the password.",
            code="invalid_api_key",
            headers={"WWW-Authenticate": _REALM},
        )
    if caller.role != "admin":
        raise APIError(
            403,
            "The audit page is for admin keys only.",
            type="permission_error",
            code="admin_only",
        )
    return caller


def _presented_key(scope: Scope) -> str | None:
    """The key of an ``Authorization`` header: Basic (the password) or Bearer."""
    for name, value in scope["headers"]:
        if name != b"authorization":
            continue
        scheme, _, credentials = bytes(value).partition(b" ")
        if scheme.lower() == b"bearer":
            return credentials.strip().decode("latin-1")
        if scheme.lower() == b"basic":
            try:
                decoded = base64.b64decode(credentials.strip(), validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                return None
            return decoded.partition(":")[2] or None
        return None
    return None


def _render(name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    html = _templates.get_template(name).render(**context)
    return HTMLResponse(html, status_code=status_code, headers={"Cache-Control": "no-store"})


def _store(request: Request) -> Any:
    return request.app.state.service.store


# -- the list -------------------------------------------------------------------------------


def _bad(name: str, why: str) -> APIError:
    return APIError(400, f"Invalid value for '{name}': {why}", param=name, code="invalid_value")


def _time(request: Request, name: str) -> int | None:
    """A time filter: unix seconds, or an ISO date and time (UTC unless it names its zone)."""
    raw = request.query_params.get(name, "").strip()
    if not raw:
        return None
    if raw.isdecimal() and len(raw) <= 12:
        return int(raw)
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise _bad(
            name, "expected unix seconds or a date and time such as 2026-12-01T18:30."
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return math.floor(moment.timestamp())


def _text(request: Request, name: str, limit: int = 256) -> str | None:
    raw = request.query_params.get(name, "").strip()
    if not raw:
        return None
    if len(raw) > limit or not raw.isprintable():
        raise _bad(name, f"at most {limit} printable characters.")
    return raw


def _query(request: Request) -> tuple[ResponseQuery, int]:
    status = _text(request, "status")
    if status is not None and status not in STATUSES:
        raise _bad("status", f"expected one of {', '.join(STATUSES)}.")
    raw_page = request.query_params.get("page", "1").strip() or "1"
    if not raw_page.isdecimal() or not 1 <= int(raw_page) <= 100_000:
        raise _bad("page", "expected a page number from 1 to 100000.")
    page = int(raw_page)
    query = ResponseQuery(
        status=status,
        model=_text(request, "model"),
        project=_text(request, "project"),
        since=_time(request, "since"),
        until=_time(request, "until"),
        text=_text(request, "q"),
        offset=(page - 1) * PAGE_SIZE,
        limit=PAGE_SIZE,
    )
    return query, page


def _when(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")


async def list_page(request: Request) -> Response:
    query, page = _query(request)
    rows, more = await _store(request).list_responses(query)
    kept = {k: v for k, v in request.query_params.items() if k != "page" and v}

    def page_url(number: int) -> str:
        return "/ui?" + urlencode({**kept, "page": number})

    return _render(
        "list.html",
        rows=rows,
        when=_when,
        filters=request.query_params,
        statuses=STATUSES,
        models=request.app.state.service.model_names(),
        page=page,
        previous_url=page_url(page - 1) if page > 1 else None,
        next_url=page_url(page + 1) if more else None,
    )


# -- one response ---------------------------------------------------------------------------


def _response_id(request: Request) -> str:
    ident: str = request.path_params["response_id"]
    if len(ident) > 256 or not ident.isprintable():
        raise not_found("Response", ascii(ident)[1:-1][:256])
    return ident


def timeline(times: Sequence[tuple[int, str, float]]) -> dict[str, Any]:
    """What the page draws and states about a log's timing (``(seq, type, recorded_at)`` per
    event): one point per time (a commit's or a write's events share theirs), the time to the
    first token, the token rate, the pauses."""
    if not times:
        return {"events": 0, "batches": [], "pauses": [], "times": []}
    start = times[0][2]
    # commits as [t (seconds since the first event), first seq, last seq]
    batches: list[list[Any]] = []
    last_t = None
    first_delta = last_delta = None
    deltas = 0
    offsets: list[float] = []
    for seq, type_, at in times:
        t = at - start
        offsets.append(round(t * 1000, 1))
        if t == last_t:
            batches[-1][2] = seq
        else:
            batches.append([t, seq, seq])
            last_t = t
        if type_ in _DELTAS:
            deltas += 1
            if first_delta is None:
                first_delta = t
            last_delta = t
    gaps = [(b[0] - a[0], a, b) for a, b in itertools.pairwise(batches)]
    threshold = PAUSE_MIN_S
    if len(gaps) >= 2:
        threshold = max(threshold, 10 * statistics.median(g for g, _, _ in gaps))
    pauses = [
        {"from": a[0], "to": b[0], "seconds": gap, "after_seq": a[2]}
        for gap, a, b in gaps
        if gap >= threshold
    ]
    rate = None
    if (
        deltas >= 2
        and last_delta is not None
        and first_delta is not None
        and last_delta > first_delta
    ):
        rate = (deltas - 1) / (last_delta - first_delta)
    sizes = [b[2] - b[1] + 1 for b in batches]
    return {
        "events": len(times),
        "duration": times[-1][2] - start,
        "ttft": first_delta,
        "deltas": deltas,
        "rate": rate,
        "batches": batches,
        "batch_mean": sum(sizes) / len(sizes),
        "batch_max": max(sizes),
        "pauses": pauses,
        "threshold": threshold,
        "times": offsets,  # per seq, milliseconds after the first event: the replay's schedule
    }


#: Dots (one per commit, with its times on hover) up to this many commits; beyond, the line only.
MAX_DOTS = 2000


def svg_timeline(line: dict[str, Any], width: int = 900, height: int = 240) -> dict[str, Any]:
    """Coordinates for the template's SVG: x is time, y is seq. The line steps at each commit;
    commits closer than half a pixel are drawn as one step (a 10,000-commit log is at most
    about 3,600 points, whatever its length)."""
    batches = line["batches"]
    pad_l, pad_r, pad_t, pad_b = 56, 12, 12, 34
    inner_w, inner_h = width - pad_l - pad_r, height - pad_t - pad_b
    span = max(line.get("duration") or 0.0, 1e-3)
    top = max(line["events"] - 1, 1)
    kx, ky = inner_w / span, inner_h / top

    def x(t: float) -> float:
        return round(pad_l + kx * t, 1)

    points: list[str] = []
    bucket = None
    low = high = 0
    for t, first, last in batches:
        here = int(t * kx * 2)
        if here != bucket:
            if bucket is not None:
                points.append(
                    f"{pad_l + bucket / 2:.1f},{pad_t + inner_h - ky * low:.1f} "
                    f"{pad_l + bucket / 2:.1f},{pad_t + inner_h - ky * high:.1f}"
                )
            bucket, low = here, first
        high = last
    if bucket is not None:
        points.append(
            f"{pad_l + bucket / 2:.1f},{pad_t + inner_h - ky * low:.1f} "
            f"{pad_l + bucket / 2:.1f},{pad_t + inner_h - ky * high:.1f}"
        )
    dots = []
    if len(batches) <= MAX_DOTS:
        dots = [
            (x(t), round(pad_t + inner_h - ky * last, 1), t, first, last)
            for t, first, last in batches
        ]
    return {
        "width": width,
        "height": height,
        "left": pad_l,
        "right": width - pad_r,
        "top": pad_t,
        "bottom": height - pad_b,
        "points": " ".join(points),
        "dots": dots,
        "ttft_x": x(line["ttft"]) if line.get("ttft") is not None else None,
        "pauses": [(x(p["from"]), x(p["to"]), p) for p in line["pauses"]],
        "span": span,
        "top_seq": line["events"] - 1,
    }


def _conversation_id(request_body: dict[str, Any]) -> str | None:
    conversation = request_body.get("conversation")
    if isinstance(conversation, str):
        return conversation
    if isinstance(conversation, dict) and isinstance(conversation.get("id"), str):
        return str(conversation["id"])
    return None


def _calls_answered(later: Sequence[tuple[ResponseRow, list[dict[str, Any]]]]) -> dict[str, Any]:
    """call_id -> (the response whose input answered it, the output item)."""
    answers: dict[str, Any] = {}
    for row, items in later:
        for item in items:
            if item.get("type") in ("function_call_output", "custom_tool_call_output"):
                answers.setdefault(str(item.get("call_id")), (row.id, item))
    return answers


async def response_page(request: Request) -> Response:
    store = _store(request)
    response_id = _response_id(request)
    row: ResponseRow | None = await store.get(response_id)
    if row is None:
        raise not_found("Response", response_id)
    times = await store.load_times(response_id)
    response: dict[str, Any] | None = None
    if times:  # what GET /v1/responses/{id} returns (the terminal snapshot, or the fold)
        response = await request.app.state.service.get(response_id)
    audit = await store.load_audit(response_id)
    prompt_ids = next((a.token_ids for a in audit if a.kind == "prompt_token_ids"), None)
    output_ids = next((a.token_ids for a in audit if a.kind == "output_token_ids"), None)
    if output_ids is None:  # still generating, or ended without its audit: what the log holds
        output_ids = tuple(await store.output_tokens(response_id))
    finish = next((a.detail for a in audit if a.kind == "finish"), None)
    prompt_text = None
    if prompt_ids is not None:
        prompt_text = request.app.state.service.encoding.decode(list(prompt_ids))
    try:
        chain = [link.row for link in await store.load_chain(response_id)][:-1]
    except NotFound:  # an earlier response was deleted: the page links to its id only
        chain = []
    later, _ = await store.list_responses(
        ResponseQuery(previous_response_id=response_id, limit=PAGE_SIZE)
    )
    later = sorted(later, key=lambda r: (r.created_at, r.id))
    later_items = [
        (
            next_row,
            (await store.list_input_items(next_row.id, after=None, limit=1000, order="asc"))[0],
        )
        for next_row in later
    ]
    conversation = _conversation_id(row.request)
    turns: list[ResponseRow] = []
    if conversation is not None:
        found, _ = await store.list_responses(
            ResponseQuery(conversation=conversation, limit=PAGE_SIZE)
        )
        turns = sorted(found, key=lambda r: (r.created_at, r.id))
    inputs, _ = await store.list_input_items(response_id, after=None, limit=1000, order="asc")
    line = timeline(times)
    return _render(
        "response.html",
        row=row,
        response=response,
        when=_when,
        inputs=inputs,
        output=(response or {}).get("output") or [],
        usage=(response or {}).get("usage"),
        answers=_calls_answered(later_items),
        line=line,
        svg=svg_timeline(line),
        prompt_text=prompt_text,
        prompt_count=None if prompt_ids is None else len(prompt_ids),
        output_ids=output_ids,
        finish=finish,
        chain=chain,
        later=later,
        conversation=conversation,
        turns=turns,
        replay={
            "stream_url": f"/ui/responses/{quote(response_id, safe='')}/stream?stream=true&starting_after=-1",
            "times": line["times"],
        },
    )


async def log_download(request: Request) -> Response:
    store = _store(request)
    response_id = _response_id(request)
    if await store.get(response_id) is None:
        raise not_found("Response", response_id)
    events = await store.load(response_id)
    audit = await store.load_audit(response_id)
    return StreamingResponse(
        log_lines(events, audit),
        media_type="application/x-ndjson",
        headers={"Content-Disposition": f'attachment; filename="{response_id}.jsonl"'},
    )


async def resume_stream(request: Request) -> Response:
    """The resume endpoint's handler (``GET /v1/responses/{id}?stream=true``), for any project."""
    from app.http import get_response  # not at the top: app.http lists these routes

    return await get_response(request)


_ONE = "/ui/responses/{response_id}"
routes = [
    Route("/ui", guard(list_page), methods=["GET"], include_in_schema=False),
    Route(_ONE, guard(response_page), methods=["GET"], include_in_schema=False),
    Route(_ONE + "/log.jsonl", guard(log_download), methods=["GET"], include_in_schema=False),
    Route(_ONE + "/stream", guard(resume_stream), methods=["GET"], include_in_schema=False),
]

#: The query parameters each page takes (``app.query`` refuses any other name, as it does for
#: the API's operations): the list's filters and page; the resume its API twin's; the others none.
QUERIES: dict[str, tuple[Query, ...]] = {
    "/ui": tuple(
        Query(name, {"type": "string"})
        for name in ("status", "model", "project", "since", "until", "q", "page")
    ),
    _ONE: (),
    _ONE + "/log.jsonl": (),
    _ONE + "/stream": OPERATIONS["GET", "/v1/responses/{response_id}"].query,
}
