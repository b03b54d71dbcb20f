"""The contract of issue 14 as assertions, shared by the fault tests.

Where the shared contract left a detail open, these are the choices (what a client would
expect); the lead was told:

* every stream that was under way when the store went away ends with the ``error`` event (none
  completes: nothing can be durable while the store is down), and its response is later closed
  ``response.failed`` with ``error.code == "store_unavailable"``;
* ``/health`` while the store is down: 503 ``{"status": "unavailable", "reason": <non-empty
  string>}``, reached within 10 s of the streams' ``error`` events; after it is back: 200
  ``{"status": "ok"}`` within 30 s;
* a POST while the store is down: 503 with ``Retry-After`` an integer number of seconds >= 1 and
  an OpenAI error body (``message``, ``type`` ``server_error``, ``param`` key present,
  ``code`` ``store_unavailable``); it may take up to statement timeout + retry time to answer;
  a DELETE of a response while PostgreSQL is stopped answers the same (the cancel path is not
  probed: which check comes first for a non-background response, 400 or 503, is left open);
* a resumer opened during the outage never hangs: it ends with the terminal event, the ``error``
  event, or is refused with 503, at the latest 30 s after the store is back;
* a 400 for a lone surrogate names the parameter: ``param``'s first component (before ``.`` or
  ``[``) is the top-level field that holds it (``metadata``, ``input``, or the unknown field's
  own name).
"""

from __future__ import annotations

import re
from typing import Any

from tests.faults.outcomes import Figures
from tests.faults.scenarios import Degraded, Outage, Poisoned, Probe

__all__ = ["degraded", "outage", "poisoned", "store_unavailable_503", "targets"]


def targets(figures: Figures, context: str) -> None:
    """The issue's targets: 0 acknowledged events lost, 0 responses non-terminal 30 s after the
    fault ended, every stream ended with a terminal or ``error`` event (and logs well-formed,
    error frames as the contract says, resumers served to the terminal event)."""
    assert figures.streams > 0 and len(figures.logs) == figures.streams, context
    assert not figures.problems(), context


def health_unavailable(probe: Probe | None, context: str) -> None:
    assert probe is not None and probe.status == 503, context
    assert isinstance(probe.body, dict) and probe.body.get("status") == "unavailable", context
    reason = probe.body.get("reason")
    assert isinstance(reason, str) and reason.strip(), context


def health_ok(probe: Probe | None, context: str) -> None:
    assert probe is not None and probe.status == 200, context
    assert probe.body == {"status": "ok"}, context


def store_unavailable_503(probe: Probe | None, context: str) -> None:
    assert probe is not None and probe.status == 503, context
    headers = {k.lower(): v for k, v in probe.headers.items()}
    retry_after = headers.get("retry-after", "")
    assert retry_after.isdigit() and int(retry_after) >= 1, context
    error = _error(probe.body, context)
    assert error["type"] == "server_error" and error["code"] == "store_unavailable", context


def _error(body: Any, context: str) -> dict[str, Any]:
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), context
    error: dict[str, Any] = body["error"]
    assert {"message", "type", "param", "code"} <= error.keys(), context
    assert isinstance(error["message"], str) and error["message"], context
    return error


def posts_work(posts: list[str], n: int, context: str) -> None:
    assert posts == ["200 completed"] * n, context


def outage(run: Outage, *, posts: int = 4) -> None:
    """An outage longer than the retry time: every stream ends with ``error``, everything is
    closed ``failed`` once the store is back, and the server serves again."""
    context = run.summary()
    assert run.server_alive, context
    targets(run.figures, context)
    assert run.figures.endings == {"error": run.figures.streams}, context
    assert set(run.figures.statuses.values()) == {"failed"}, context
    health_unavailable(run.health_during, context)
    store_unavailable_503(run.post_during, context)
    if run.delete_during is not None:  # probed on a stopped PostgreSQL
        store_unavailable_503(run.delete_during, context)
    assert run.resume_during in ("terminal", "error", "http 503"), context
    health_ok(run.health_after, context)
    posts_work(run.posts_after, posts, context)


def degraded(run: Degraded) -> None:
    context = run.summary()
    assert run.started and run.alive_after_probes, context
    health_unavailable(run.health, context)
    assert run.get_stored is not None and run.get_stored.status == 200, context
    assert isinstance(run.get_stored.body, dict) and run.get_stored.body["status"] == "completed", (
        context
    )
    store_unavailable_503(run.post, context)
    health_ok(run.health_after, context)
    assert run.left_in_progress == "failed" and run.closed_after_s is not None, context
    posts_work(run.posts_after, 4, context)


def poisoned(run: Poisoned) -> None:
    context = run.summary()
    assert run.server_alive, context
    assert len(run.answers) == 3 * run.rounds, context
    for where, param, status, body in run.answers:
        assert status == 400, f"{where}: {status}\n{context}"
        error = _error(body, f"{where}\n{context}")
        assert error["type"] == "invalid_request_error", f"{where}\n{context}"
        named = error["param"]
        assert isinstance(named, str) and re.split(r"[.\[]", named)[0] == param, (
            f"{where}: param {named!r}, expected it to name {param!r}\n{context}"
        )
    targets(run.figures, context)
    assert run.figures.endings == {"terminal": run.figures.streams}, context
    assert set(run.figures.statuses.values()) == {"completed"}, context
