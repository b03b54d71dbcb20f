"""What a client of a faulty server saw, and whether the issue's targets hold (issue 14).

:class:`LiveStream` reads one streamed ``POST /v1/responses`` with a raw SSE parser (httpx
streaming, in a thread of its own), so a clean EOF without a terminal or ``error`` frame is
seen as what it is: a silent end. :func:`settle` is the one check every fault scenario ends
with; it measures, per fault:

* **lost**: events a client received (acknowledged) that are not in the log with the same
  ``seq``, ``type`` and payload (read back with ``GET /v1/responses/{id}/events``);
* **silent**: streams that ended without a terminal event or the ``error`` event (EOF, a
  dropped connection, frames after the end);
* **non_terminal**: responses still not terminal 30 s after the fault ended;
* **bad_logs**: logs that are not 0..n contiguous with exactly one terminal event, last;
* **bad_errors**: ``error`` frames that are not the contract's (``code`` ``store_unavailable``,
  ``param`` null, a message, ``sequence_number`` = the seq the next event would have taken),
  and responses whose stream ended with one but whose log is not closed ``response.failed`` /
  ``store_unavailable``;
* **bad_resumes**: a resumer (``GET ?stream=true&starting_after=<last seq received>``) of a
  stream that ended with the ``error`` event that did not receive the rest of the log, ending
  with its terminal event.

The benchmark (``bench/faults.py``) prints these counts; the tests assert they are all zero.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = [
    "TERMINALS",
    "Figures",
    "LiveStream",
    "parse_sse",
    "settle",
    "start_streams",
    "wait_until",
]

TERMINALS = frozenset(
    ("response.completed", "response.incomplete", "response.failed", "response.cancelled")
)
TERMINAL_STATUSES = frozenset(("completed", "incomplete", "failed", "cancelled"))


def parse_sse(lines: Iterable[bytes]) -> Iterator[tuple[str, str]]:
    """(event, data) per dispatched frame of an SSE byte stream split into lines (comments and
    keep-alive pings skipped); an incomplete frame at EOF is not dispatched, as in a browser."""
    event, data = "", []
    for raw in lines:
        line = raw.rstrip(b"\r").decode("utf-8")
        if line == "":
            if data:
                yield event or "message", "\n".join(data)
            event, data = "", []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)


def _lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        yield from complete
    if buffer:
        yield buffer  # no trailing newline: never completes a frame


class LiveStream(threading.Thread):
    """One streamed POST, read raw. ``ending`` is, once the thread is done:

    ``terminal`` (the last frame was a terminal event), ``error`` (the ``error`` event),
    ``eof`` (a clean end without either: silent), ``after-end`` (frames after the terminal or
    error frame), ``http <status>`` (the POST was refused), ``transport <name>`` (the connection
    broke or the read timed out before either frame)."""

    def __init__(
        self, base_url: str, body: Mapping[str, Any], *, read_timeout_s: float = 120
    ) -> None:
        super().__init__(daemon=True)
        self.url = base_url + "/v1/responses"
        self.body = {**body, "stream": True}
        self.read_timeout_s = read_timeout_s
        self.events: list[dict[str, Any]] = []  # every data frame but the error, in order
        self.error: dict[str, Any] | None = None
        self.error_event_name: str | None = None
        self.after_end: list[str] = []
        self.status: int | None = None
        self.refusal: str | None = None
        self.ending: str | None = None
        self.started_at = time.monotonic()
        self.ended_at: float | None = None
        self._resume: tuple[str, int] | None = None

    @classmethod
    def resume(cls, base_url: str, response_id: str, after: int) -> LiveStream:
        """A resumer: ``GET /v1/responses/{id}?stream=true&starting_after=after``, read the same way."""
        stream = cls(base_url, {})
        stream.url = f"{base_url}/v1/responses/{response_id}"
        stream._resume = (response_id, after)
        return stream

    @property
    def response_id(self) -> str | None:
        if self._resume is not None:
            return self._resume[0]
        for event in self.events[:1]:
            response = event.get("response")
            if isinstance(response, dict):
                return str(response["id"])
        return None

    @property
    def deltas(self) -> int:
        return sum(e["type"].endswith(".delta") for e in self.events)

    @property
    def last_seq(self) -> int:
        return int(self.events[-1]["sequence_number"]) if self.events else -1

    def run(self) -> None:
        ended = None
        try:
            timeout = httpx.Timeout(30, read=self.read_timeout_s)
            with (
                httpx.Client(timeout=timeout) as client,
                (
                    client.stream(
                        "GET",
                        self.url,
                        params={"stream": "true", "starting_after": self._resume[1]},
                    )
                    if self._resume is not None
                    else client.stream("POST", self.url, json=self.body)
                ) as r,
            ):
                self.status = r.status_code
                if r.status_code != 200:
                    self.refusal = r.read().decode(errors="replace")
                    self.ending = f"http {r.status_code}"
                    return
                for name, data in parse_sse(_lines(r.iter_raw())):
                    if ended is not None:
                        self.after_end.append(name)
                        continue
                    payload = json.loads(data)
                    if name == "error" or payload.get("type") == "error":
                        self.error, self.error_event_name, ended = payload, name, "error"
                    else:
                        self.events.append(payload)
                        if payload.get("type") in TERMINALS:
                            ended = "terminal"
            self.ending = "after-end" if self.after_end else (ended or "eof")
        except httpx.HTTPError as exc:
            self.ending = ended or f"transport {type(exc).__name__}"
        except Exception as exc:  # a frame that is not JSON, ...: reported, not raised in a thread
            self.ending = f"broken {type(exc).__name__}: {exc}"
        finally:
            self.ended_at = time.monotonic()

    def describe(self) -> str:
        last = self.events[-1]["type"] if self.events else None
        return (
            f"{self.response_id or '?'}: {self.ending}, {len(self.events)} events, last {last}"
            + (f", refused: {self.refusal[:200]}" if self.refusal else "")
        )


def start_streams(base_url: str, body: Mapping[str, Any], n: int) -> list[LiveStream]:
    streams = [LiveStream(base_url, body) for _ in range(n)]
    for stream in streams:
        stream.start()
    return streams


def wait_until(condition: Any, timeout_s: float, what: str, interval_s: float = 0.05) -> float:
    """Poll ``condition()`` until true; the seconds it took. AssertionError after ``timeout_s``."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)
    return time.monotonic() - start


def join_all(streams: Sequence[LiveStream], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for stream in streams:
        stream.join(max(0.0, deadline - time.monotonic()))


@dataclass
class Figures:
    """Per-fault counts (each a list of descriptions; the figure is its length)."""

    streams: int = 0
    endings: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    silent: list[str] = field(default_factory=list)
    non_terminal: list[str] = field(default_factory=list)
    bad_logs: list[str] = field(default_factory=list)
    bad_errors: list[str] = field(default_factory=list)
    bad_resumes: list[str] = field(default_factory=list)
    #: response id -> its stored log (events endpoint ``data``)
    logs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: response id -> final status (GET)
    statuses: dict[str, str] = field(default_factory=dict)
    #: seconds from the fault's end until every response was terminal (None: not within 30 s)
    terminal_after_s: float | None = None

    @property
    def acknowledged(self) -> int:
        return sum(len(log) for log in self.logs.values())

    def problems(self) -> dict[str, list[str]]:
        named = {
            "lost": self.lost,
            "silent": self.silent,
            "non_terminal": self.non_terminal,
            "bad_logs": self.bad_logs,
            "bad_errors": self.bad_errors,
            "bad_resumes": self.bad_resumes,
        }
        return {name: items for name, items in named.items() if items}

    def summary(self) -> str:
        problems = self.problems()
        lines = [f"{self.streams} streams, endings {dict(self.endings)}"]
        for name, items in problems.items():
            lines.append(f"{name}: {len(items)}")
            lines.extend(f"  {item}" for item in items[:8])
        return "\n".join(lines)


def _get_json(client: httpx.Client, url: str) -> tuple[int, Any]:
    try:
        r = client.get(url)
    except httpx.HTTPError as exc:
        return 0, f"{type(exc).__name__}: {exc}"
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text


def _payload(frame: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in frame.items() if k not in ("type", "sequence_number")}


def _resume(
    client: httpx.Client, base_url: str, response_id: str, after: int
) -> list[dict[str, Any]]:
    with client.stream(
        "GET",
        f"{base_url}/v1/responses/{response_id}",
        params={"stream": "true", "starting_after": after},
    ) as r:
        if r.status_code != 200:
            raise AssertionError(f"resume answered {r.status_code}: {r.read()[:200]!r}")
        return [json.loads(data) for _, data in parse_sse(_lines(r.iter_raw()))]


def settle(
    base_url: str,
    streams: Sequence[LiveStream],
    *,
    fault_ended_at: float,
    terminal_within_s: float = 30,
    extra_ids: Iterable[str] = (),
    resumes: int | None = 4,
) -> Figures:
    """Wait for the streams to end and every response to be terminal (at most
    ``terminal_within_s`` after ``fault_ended_at``), then check everything against the logs.
    ``resumes``: how many of the streams that ended with ``error`` to resume (None: all)."""
    figures = Figures(streams=len(streams))
    join_all(streams, max(5.0, fault_ended_at + terminal_within_s - time.monotonic()))
    for stream in streams:
        if stream.is_alive():
            stream.ending = stream.ending or "still open"
        figures.endings[(stream.ending or "?").split(":")[0]] += 1
        if stream.ending not in ("terminal", "error"):
            figures.silent.append(stream.describe())
    ids = [s.response_id for s in streams if s.response_id] + list(extra_ids)
    deadline = fault_ended_at + terminal_within_s
    with httpx.Client(timeout=10) as client:
        pending = set(ids)
        while True:
            for response_id in sorted(pending):
                status, body = _get_json(client, f"{base_url}/v1/responses/{response_id}")
                if status == 200 and isinstance(body, dict):
                    figures.statuses[response_id] = str(body.get("status"))
                    if body.get("status") in TERMINAL_STATUSES:
                        pending.discard(response_id)
            if not pending:
                figures.terminal_after_s = max(0.0, time.monotonic() - fault_ended_at)
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        figures.non_terminal = [
            f"{rid}: {figures.statuses.get(rid, 'unreadable')}" for rid in sorted(pending)
        ]

        for response_id in ids:
            status, body = _get_json(client, f"{base_url}/v1/responses/{response_id}/events")
            if status != 200 or not isinstance(body, dict):
                figures.bad_logs.append(f"{response_id}: events answered {status}: {body!r:.200}")
                continue
            log = list(body["data"])
            figures.logs[response_id] = log
            seqs = [e["seq"] for e in log]
            terminals = [e["seq"] for e in log if e["type"] in TERMINALS]
            if seqs != list(range(len(log))):
                figures.bad_logs.append(f"{response_id}: seqs are not 0..n contiguous")
            if terminals != ([len(log) - 1] if log else []) or not terminals:
                figures.bad_logs.append(
                    f"{response_id}: terminal events at {terminals} of {len(log)}"
                )

        resumed = 0
        for stream in streams:
            response_id = stream.response_id
            if response_id is None or response_id not in figures.logs:
                continue  # nothing acknowledged, or the log is unreadable (counted in bad_logs)
            log = figures.logs[response_id]
            for i, event in enumerate(stream.events):
                seq = event.get("sequence_number")
                if seq != i:
                    figures.lost.append(f"{response_id}: the {i}th event received has seq {seq}")
                    break
                if i >= len(log):
                    figures.lost.append(
                        f"{response_id}: seq {i} ({event['type']}) is not in the log"
                    )
                    continue
                stored = log[i]
                if stored["type"] != event["type"]:
                    figures.lost.append(
                        f"{response_id}: seq {i} received as {event['type']}, stored as {stored['type']}"
                    )
                elif stored["payload"] != _payload(event):
                    figures.lost.append(
                        f"{response_id}: seq {i} ({event['type']}) stored with another payload"
                    )
            if stream.ending == "terminal" and log and log[-1]["seq"] != stream.last_seq:
                figures.bad_logs.append(
                    f"{response_id}: the stream's terminal event is not the log's last"
                )
            if stream.ending == "error" and stream.error is not None:
                figures.bad_errors.extend(_error_problems(stream, log))
                if resumes is None or resumed < resumes:
                    resumed += 1
                    try:
                        tail = _resume(client, base_url, response_id, stream.last_seq)
                    except (AssertionError, httpx.HTTPError, ValueError) as exc:
                        figures.bad_resumes.append(f"{response_id}: {exc}")
                        continue
                    expected = log[stream.last_seq + 1 :]
                    got = [(e.get("sequence_number"), e.get("type")) for e in tail]
                    want = [(e["seq"], e["type"]) for e in expected]
                    if got != want or not tail or tail[-1].get("type") not in TERMINALS:
                        figures.bad_resumes.append(
                            f"{response_id}: resumed after {stream.last_seq}: got {got[-3:]} of "
                            f"{len(got)}, the log has {want[-3:]} of {len(want)}"
                        )
    return figures


def _error_problems(stream: LiveStream, log: Sequence[Mapping[str, Any]]) -> list[str]:
    rid = stream.response_id
    error = stream.error or {}
    problems = []
    if stream.error_event_name != "error":
        problems.append(f"{rid}: the error frame's event name is {stream.error_event_name!r}")
    if error.get("type") != "error" or error.get("code") != "store_unavailable":
        problems.append(f"{rid}: error frame {error!r:.300}")
    if "param" not in error or error.get("param") is not None:
        problems.append(f"{rid}: the error frame's param is not null: {error!r:.300}")
    if not isinstance(error.get("message"), str) or not error.get("message"):
        problems.append(f"{rid}: the error frame has no message")
    if error.get("sequence_number") != stream.last_seq + 1:
        problems.append(
            f"{rid}: the error frame's sequence_number is {error.get('sequence_number')}, "
            f"the next event would have been {stream.last_seq + 1}"
        )
    if log:
        terminal = log[-1]
        code = (terminal.get("payload", {}).get("response", {}).get("error") or {}).get("code")
        if terminal["type"] != "response.failed" or code != "store_unavailable":
            problems.append(
                f"{rid}: its stream ended with the error event, its log with {terminal['type']} "
                f"(error code {code!r}), not response.failed / store_unavailable"
            )
        if any(e["type"] == "error" for e in log):
            problems.append(f"{rid}: the error event is in the log")
    return problems
