"""Configuration: one frozen object, built from the environment (and the command line).

Every setting has an environment variable (listed in the README); the command line of
``responses-ledger serve`` overrides it (the variable is then not read, and the option's value is
checked as the variable's would be). Nothing is read at import time: ``Settings.from_env()``
is called by the CLI (or a test) and the result is passed to ``create_app``.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from uvicorn.config import LOG_LEVELS

from app.contract import EFFORTS
from app.turns import SETUP_SHARE

__all__ = ["Settings", "SettingsError"]

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./data/responses.db"


class SettingsError(ValueError):
    """A setting that cannot be used; the message names its variable, the value and what it
    takes. ``responses-ledger`` prints it in one line and exits with status 2, before anything
    starts."""


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _bool(value: str) -> bool:
    word = value.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    # (a typo must not turn a switch off: RESPONSES_LEDGER_METRICS=ture was False)
    raise ValueError("takes true or false (1/0, yes/no, on/off)")


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError("takes a whole number") from None


def _float(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError("takes a number") from None


def _names(value: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    if not names:  # (",", " ": set, yet naming nothing; it meant the default)
        raise ValueError("takes one or more names, comma-separated")
    return names


def _gc_threshold(value: str) -> tuple[int, int, int] | None:
    """``gen0,gen1,gen2`` thresholds, or ``python`` to leave the interpreter's GC as it is."""
    if value.strip().lower() in ("python", "default", "off", "none"):
        return None
    try:
        parts = tuple(int(part) for part in value.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3 or min(parts) < 1:
        raise ValueError("takes gen0,gen1,gen2 (three whole numbers of at least 1) or python")
    return parts[0], parts[1], parts[2]


def _one_of(*choices: str) -> Callable[[str], str]:
    """A converter to one of ``choices`` (any case, spaces around ignored)."""

    def convert(value: str) -> str:
        word = value.strip().lower()
        if word not in choices:
            raise ValueError(f"takes {', '.join(choices[:-1])} or {choices[-1]}")
        return word

    return convert


def _setup_share(value: str) -> float:
    share = _float(value)
    if not 0 < share <= 1:
        raise ValueError("takes a number in (0, 1]")
    return share


#: ``Settings.engine``'s values (``app.main.build_engine``).
ENGINES = ("echo", "scripted", "vllm")
#: ``Settings.event_loop``'s values (``app.transport.loop_name`` resolves them).
EVENT_LOOPS = ("auto", "uvloop", "asyncio")
#: ``Settings.http_implementation``'s values (``app.transport.protocol_class`` resolves them).
HTTP_IMPLEMENTATIONS = ("auto", "h11", "httptools")

_engine = _one_of(*ENGINES)
_event_loop = _one_of(*EVENT_LOOPS)
_takeover = _one_of("continue", "fail")
_log_format = _one_of("json", "text")
_log_level = _one_of(*LOG_LEVELS)
_http_implementation = _one_of(*HTTP_IMPLEMENTATIONS)
#: (a request without ``reasoning.effort`` takes it: a value no request could send would fail
#: every such request with a 400 about a parameter its client never sent)
_effort = _one_of(*EFFORTS)


def _reasoning_key(value: str) -> str:
    try:
        key = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != 32:
        raise ValueError("takes 32 bytes in base64 (openssl rand -base64 32)")
    return value.strip()


def _host(name: str) -> str | None:
    """A host name or address as the server uses it: in lower case, an IPv6 address without its
    brackets; None if it carries a scheme, a port or a path (it could never match or bind)."""
    host = name.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or re.search(r"[/\s@?#]", host) or (":" in host and not _is_ipv6(host)):
        return None
    return host


def _hosts(value: str) -> tuple[str, ...]:
    """Host names as ``app.browser`` compares them with a Host header's."""
    hosts = []
    for name in _names(value):
        host = "*" if name == "*" else _host(name)
        if host is None:
            raise ValueError(
                f"takes host names without a scheme or a port (example.com, 10.0.0.5, ::1) or *;"
                f" {name!r} is not one"
            )
        hosts.append(host)
    return tuple(hosts)


def _bind_host(value: str) -> str:
    host = _host(value)
    if host is None:
        raise ValueError(
            "takes a host name or address to listen on, without a scheme or a port (127.0.0.1,"
            " 0.0.0.0, ::, ledger.internal; the port is RESPONSES_LEDGER_PORT)"
        )
    return host


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


#: An origin as a browser sends it: scheme://host[:port], no path (RFC 6454).
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/?#@\s]+")


def _origins(value: str) -> tuple[str, ...]:
    origins = []
    for name in _names(value):
        origin = name.lower()
        if origin != "*" and not _ORIGIN.fullmatch(origin):
            raise ValueError(
                "takes origins as a browser sends them, scheme://host[:port] without a path"
                f" (https://app.example.com), or *; {name!r} is not one"
            )
        origins.append(origin)
    return tuple(origins)


#: The numbers a setting may take, by field: (the least, whether it may equal it). Every number
#: must also be finite. Checked for the environment and the command line alike (``from_env``).
_LEAST: dict[str, tuple[float, bool]] = {
    "port": (0, True),
    "commit_window_ms": (0, True),
    "store_retry_s": (0, True),
    "statement_timeout_s": (0, False),
    "repair_interval_s": (0, False),
    "lease_s": (0, False),
    "heartbeat_s": (0, False),
    "drain_s": (0, True),
    "max_body_bytes": (1, True),
    "http_header_timeout_s": (0, False),
    "http_keep_alive_s": (0, False),
    "http_max_head_bytes": (1, True),
    "http_max_connections": (0, True),
    "send_buffer_bytes": (1, True),
    "send_stall_s": (0, False),
    "frontends": (1, True),
    "key_cache_s": (0, True),
}


def _out_of_range(name: str, value: float) -> str | None:
    """What is wrong with ``value`` for the field ``name`` (None: nothing)."""
    least, inclusive = _LEAST[name]
    if not math.isfinite(value):
        return "takes a finite number"
    if name == "port" and value > 65535:
        return "takes a port number, 0 to 65535"
    if value < least or (value == least and not inclusive):
        return f"takes a number {'of at least' if inclusive else 'over'} {least:g}"
    return None


#: What ``responses-ledger serve`` sets unless told otherwise (see ``Settings.gc_threshold``).
SERVE_GC_THRESHOLD = (50_000, 50, 1_000)


def _aliases(value: str) -> dict[str, str]:
    """``alias=model,alias2=model`` -> {alias: model}."""
    out: dict[str, str] = {}
    for pair in _names(value):
        alias, _, target = (part.strip() for part in pair.partition("="))
        if not alias or not target:
            raise ValueError(f"takes alias=model pairs, and {pair!r} is not one")
        if alias in out:
            raise ValueError(f"names the alias {alias!r} twice")
        out[alias] = target
    return out


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    database_url: str = DEFAULT_DATABASE_URL
    #: echo | scripted | vllm
    engine: str = "echo"
    #: The scripted engine's JSON file.
    script: str | None = None
    #: The model to load (vllm: a path or a name); also the served name unless one is given.
    model: str | None = None
    #: Names clients may send as ``model``; the first is the canonical one. Default: the model.
    served_model_names: tuple[str, ...] = ()
    #: Extra accepted names: alias -> served name.
    model_aliases: Mapping[str, str] = field(default_factory=dict)
    #: Group-commit window: how long a commit waits for company after the first write of an idle
    #: spell. 0: it goes at the next turn of the event loop, with everything queued in that turn;
    #: writes that arrive while a commit runs go together right after it either way. A window
    #: only added latency (paced 64 streams: p50 4.4-4.7 -> 3.0-3.6 ms at 0, throughput unchanged).
    commit_window_ms: float = 0.0
    #: Key for encrypted reasoning (base64, 32 bytes). Default: generated once, kept in the DB.
    reasoning_key: str | None = None
    #: Close responses left in progress by a previous process at start-up.
    recover_on_start: bool = True
    #: Reasoning effort when a request gives none.
    default_reasoning_effort: str = "medium"
    #: How long a commit the database does not take (down, frozen, read-only, full, locked) is
    #: retried, generation paused, before its responses give up: their streams end with an
    #: ``error`` event, and the repair loop closes them ``failed`` once the database is back.
    store_retry_s: float = 20.0
    #: The longest any database statement or commit may take (a frozen database cannot stall
    #: a stream for longer than this plus the retry time).
    statement_timeout_s: float = 5.0
    #: How often the repair loop probes an unavailable database and closes stranded responses.
    repair_interval_s: float = 1.0
    #: A replica's lease: how long after its last heartbeat the responses it owns count as
    #: orphaned (closed by the other servers' repair loops).
    lease_s: float = 3.0
    #: How often a replica renews its lease.
    heartbeat_s: float = 1.0
    #: What a replica does with an orphaned response (its owner died or lost its lease, or the
    #: previous process on this database stopped): ``continue`` generating it from its log
    #: (``app.takeover``), or ``fail`` it (``response.failed``).
    takeover: str = "continue"
    #: On SIGTERM: how long in-flight responses may take to finish before they are handed to
    #: the other replicas (or, alone, ended ``incomplete``); and as long again for the streams
    #: this replica serves to follow the handed-over responses to their end.
    drain_s: float = 30.0
    #: Largest request body accepted, in bytes (413 above).
    max_body_bytes: int = 16 * 1024 * 1024
    #: HTTP limits (see ``app.transport``). The whole request head must arrive within this many
    #: seconds of its first byte (of the connection, for its first request); 408 after.
    http_header_timeout_s: float = 10.0
    #: An idle keep-alive connection is closed after this many seconds.
    http_keep_alive_s: float = 5.0
    #: Largest request head (request line and headers), in bytes (431 above).
    http_max_head_bytes: int = 64 * 1024
    #: Most open connections; over it the one waiting longest for a request (reading its head,
    #: or idle) is closed to make room. 0: sized from the file-descriptor limit at start.
    http_max_connections: int = 0
    #: uvicorn's HTTP/1.1 parser: auto (httptools when installed, else h11), h11 or httptools.
    http_implementation: str = "auto"
    #: The event loop: auto (uvloop when installed, else asyncio's), uvloop or asyncio. Both
    #: uvloop and httptools are dependencies; every benchmark figure was measured with them.
    event_loop: str = "auto"
    #: A live stream whose client has this many bytes unread is closed (the response goes on).
    send_buffer_bytes: int = 4 * 1024 * 1024
    #: A connection whose client reads nothing for this many seconds is closed.
    send_stall_s: float = 60.0
    #: The text of the tokens that wait for a commit is one delta (``domain.builder``'s
    #: ``coalesce``); false: a delta a token, whatever waits. On by default since the thirtieth
    #: session: unpaced, 2.4-2.7x the naive peer's tokens/s instead of 0.85-1.32, and at 256
    #: paced streams no CPU a token more (bench/RESULTS.md, "deltas that follow the commits,
    #: measured again").
    coalesce_deltas: bool = True
    #: While paced responses generate, a burst of new responses' set-ups takes at most this
    #: share of the event loop's time, so the running streams' tokens do not wait for them
    #: (``app.turns``); 1: one set-up a turn of the loop, without pause.
    setup_share: float = SETUP_SHARE
    log_level: str = "info"
    #: ``json``: one JSON object a line (``app.logs``); ``text``: plain lines.
    log_format: str = "json"
    #: Prometheus metrics (``GET /metrics``, ``app.metrics``); false: none are kept or served.
    metrics: bool = True
    #: Frontend processes on one port over one engine (``app.frontends``); 1: this process alone.
    frontends: int = 1
    #: Garbage collector tuning, applied once start-up is done: everything alive then is frozen
    #: (``gc.freeze``: never scanned again) and the thresholds are set to this. Streaming makes
    #: several container objects per token; with Python's default (700, 10, 10) the collector
    #: took about a fifth of the server's CPU. None: leave the interpreter's GC alone (the
    #: default for an app built in-process, e.g. by tests; ``serve`` uses SERVE_GC_THRESHOLD).
    gc_threshold: tuple[int, int, int] | None = None
    #: One static API key (vLLM's ``--api-key`` habit): a caller presenting it is an admin of
    #: the ``default`` project. Keys made with ``responses-ledger keys create`` also work.
    api_key: str | None = None
    #: Whether every ``/v1`` request needs a key. None: yes when a static key is set or the
    #: database holds an unrevoked key at start-up, else the server runs open.
    require_api_key: bool | None = None
    #: Run open (no keys) although bound to an address other than loopback; without it such a
    #: server refuses to start.
    run_open: bool = False
    #: How long a verified key is trusted without reading the database again (so a revocation
    #: reaches every running server within this time).
    key_cache_s: float = 10.0
    #: Host header names accepted (``*``: any). Empty: the loopback names when bound to
    #: loopback (DNS rebinding), any name otherwise.
    allowed_hosts: tuple[str, ...] = ()
    #: Origins a browser may call from (CORS). Empty: none (no CORS headers, and a request
    #: carrying any other ``Origin`` is refused).
    cors_origins: tuple[str, ...] = ()
    #: Engine-specific options (vLLM engine arguments), passed through.
    engine_options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def model_names(self) -> tuple[str, ...]:
        if self.served_model_names:
            return self.served_model_names
        if self.model:
            return (self.model,)
        return ("gpt-oss-20b" if self.engine == "vllm" else f"gpt-oss-{self.engine}",)

    def unused_variables(self, environ: Mapping[str, str] | None = None) -> list[str]:
        """The variables set for another engine than the one that runs (the scripted engine's
        file, the vLLM engine's ``RESPONSES_LEDGER_VLLM_*``): read by nothing, so ``serve``
        says so at start. (Their command-line options are refused instead: ``app.cli``.)"""
        env = os.environ if environ is None else environ
        unused = []
        if self.engine != "scripted" and env.get("RESPONSES_LEDGER_SCRIPT"):
            unused.append("RESPONSES_LEDGER_SCRIPT")
        if self.engine != "vllm":
            unused.extend(
                sorted(v for v in env if v.startswith("RESPONSES_LEDGER_VLLM_") and env[v])
            )
        return unused

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, serving: bool = False, **overrides: Any
    ) -> Settings:
        """``serving``: for ``responses-ledger serve``, whose GC tuning defaults to
        SERVE_GC_THRESHOLD (an app built in-process leaves the GC alone unless told)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        simple: dict[str, tuple[str, Callable[[str], Any]]] = {
            "RESPONSES_LEDGER_HOST": ("host", _bind_host),
            "RESPONSES_LEDGER_PORT": ("port", _int),
            "DATABASE_URL": ("database_url", str),
            "RESPONSES_LEDGER_ENGINE": ("engine", _engine),
            "RESPONSES_LEDGER_SCRIPT": ("script", str),
            "RESPONSES_LEDGER_MODEL": ("model", str),
            "RESPONSES_LEDGER_SERVED_MODEL_NAME": ("served_model_names", _names),
            "RESPONSES_LEDGER_MODEL_ALIASES": ("model_aliases", _aliases),
            "RESPONSES_LEDGER_COMMIT_WINDOW_MS": ("commit_window_ms", _float),
            "RESPONSES_LEDGER_REASONING_KEY": ("reasoning_key", _reasoning_key),
            "RESPONSES_LEDGER_RECOVER_ON_START": ("recover_on_start", _bool),
            "RESPONSES_LEDGER_DEFAULT_REASONING_EFFORT": ("default_reasoning_effort", _effort),
            "RESPONSES_LEDGER_MAX_BODY_BYTES": ("max_body_bytes", _int),
            "RESPONSES_LEDGER_STORE_RETRY_S": ("store_retry_s", _float),
            "RESPONSES_LEDGER_STATEMENT_TIMEOUT_S": ("statement_timeout_s", _float),
            "RESPONSES_LEDGER_REPAIR_INTERVAL_S": ("repair_interval_s", _float),
            "RESPONSES_LEDGER_LEASE_S": ("lease_s", _float),
            "RESPONSES_LEDGER_HEARTBEAT_S": ("heartbeat_s", _float),
            "RESPONSES_LEDGER_TAKEOVER": ("takeover", _takeover),
            "RESPONSES_LEDGER_DRAIN_S": ("drain_s", _float),
            "RESPONSES_LEDGER_HTTP_HEADER_TIMEOUT_S": ("http_header_timeout_s", _float),
            "RESPONSES_LEDGER_HTTP_KEEP_ALIVE_S": ("http_keep_alive_s", _float),
            "RESPONSES_LEDGER_HTTP_MAX_HEAD_BYTES": ("http_max_head_bytes", _int),
            "RESPONSES_LEDGER_HTTP_MAX_CONNECTIONS": ("http_max_connections", _int),
            "RESPONSES_LEDGER_HTTP_IMPLEMENTATION": ("http_implementation", _http_implementation),
            "RESPONSES_LEDGER_EVENT_LOOP": ("event_loop", _event_loop),
            "RESPONSES_LEDGER_SEND_BUFFER_BYTES": ("send_buffer_bytes", _int),
            "RESPONSES_LEDGER_SEND_STALL_S": ("send_stall_s", _float),
            "RESPONSES_LEDGER_COALESCE_DELTAS": ("coalesce_deltas", _bool),
            "RESPONSES_LEDGER_SETUP_SHARE": ("setup_share", _setup_share),
            "RESPONSES_LEDGER_LOG_LEVEL": ("log_level", _log_level),
            "RESPONSES_LEDGER_LOG_FORMAT": ("log_format", _log_format),
            "RESPONSES_LEDGER_METRICS": ("metrics", _bool),
            "RESPONSES_LEDGER_FRONTENDS": ("frontends", _int),
            "RESPONSES_LEDGER_API_KEY": ("api_key", str),
            "RESPONSES_LEDGER_REQUIRE_API_KEY": ("require_api_key", _bool),
            "RESPONSES_LEDGER_RUN_OPEN": ("run_open", _bool),
            "RESPONSES_LEDGER_KEY_CACHE_S": ("key_cache_s", _float),
            "RESPONSES_LEDGER_ALLOWED_HOSTS": ("allowed_hosts", _hosts),
            "RESPONSES_LEDGER_CORS_ORIGINS": ("cors_origins", _origins),
            "RESPONSES_LEDGER_GC_THRESHOLD": ("gc_threshold", _gc_threshold),
        }
        if serving:
            values["gc_threshold"] = SERVE_GC_THRESHOLD
        overrides = {k: v for k, v in overrides.items() if v is not None}
        given = dict(overrides)  # (as the command line gave them, for ``refused``)
        variables = {name: var for var, (name, _) in simple.items()}

        def refused(name: str, why: str) -> SettingsError:
            """A refusal of field ``name`` that says where its value came from."""
            if name in given:
                return SettingsError(f"--{name.replace('_', '-')} {given[name]}: {why}")
            return SettingsError(f"{variables[name]}={env.get(variables[name])!r}: {why}")

        for var, (name, convert) in simple.items():
            if name in overrides:  # the command line's value, checked as the variable's would be
                if isinstance(overrides[name], str):
                    try:
                        overrides[name] = convert(overrides[name])
                    except ValueError as exc:
                        raise refused(name, str(exc)) from None
            elif value := env.get(var):
                try:
                    values[name] = convert(value)
                except ValueError as exc:
                    raise refused(name, str(exc)) from None
        settings = cls(**values)
        settings = replace(settings, **overrides) if overrides else settings
        for name in _LEAST:
            wrong = _out_of_range(name, getattr(settings, name))
            if wrong is not None:
                raise refused(name, wrong)
        if settings.heartbeat_s >= settings.lease_s:
            # its lease would lapse between two heartbeats: the other replicas would take its
            # live responses over while it still generates them
            raise SettingsError(
                f"RESPONSES_LEDGER_HEARTBEAT_S ({settings.heartbeat_s:g} s) must be shorter than"
                f" RESPONSES_LEDGER_LEASE_S ({settings.lease_s:g} s; a third of it or less is"
                " usual): a lease that lapses between heartbeats hands live responses over"
            )
        if settings.engine == "vllm" and not settings.model:
            raise SettingsError(
                "the vllm engine needs a model: --model PATH_OR_NAME (or RESPONSES_LEDGER_MODEL)"
            )
        served = settings.model_names
        for alias, target in settings.model_aliases.items():
            if alias in served:
                raise refused("model_aliases", f"{alias}={target} is a served model's own name")
            if target not in served:
                raise refused(
                    "model_aliases",
                    f"{alias}={target} names no served model (this server serves"
                    f" {', '.join(served)})",
                )
        return settings
