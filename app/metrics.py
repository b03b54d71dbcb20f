"""Prometheus metrics: ``GET /metrics``, the ledger's own ``ledger_*`` and vLLM's ``vllm:*``.

Everything is counted in this process; a scrape computes nothing with SQL. Two kinds:

- **Read at scrape time** (:class:`_Collector`): totals the code keeps anyway as plain integers
  (the store's commits, events, errors and retries; open streams and followers; takeovers,
  drains). Nothing on the hot path at all.
- **Observed as they happen**: latency and size distributions (:class:`Histogram`), and the
  per-request counters. On the per-token path only the commit is observed, never a token: the
  store observes each transaction (duration, events), the log writer each batch a client
  receives (time to first token, the gap since the previous batch). A batch holds every token
  made while the previous commit ran, so a commit costs one observation however many tokens
  it carries. prometheus_client's own ``Histogram.observe`` takes a lock and costs 1-2 us;
  :class:`Histogram` here is a ``list.append`` whose values are bucketed in bulk later, safe
  because every observation is made on the event loop's thread.

vLLM's engine metrics (``vllm:time_to_first_token_seconds``, ``vllm:num_requests_running``,
``vllm:kv_cache_usage_perc``, ...) come from its ``PrometheusStatLogger``, which the vLLM engine
hands to ``AsyncLLM`` (``app.engines.vllm``); it registers them in prometheus_client's global
registry, which the scrape includes (with the ``process_*`` and ``python_*`` collectors).

``RESPONSES_LEDGER_METRICS=false`` turns all of it off: no observation is made, ``/metrics``
is a 404, and the vLLM engine gets no stat logger.

``/metrics`` needs an admin key when keys are on: the counters name models, and the totals say
how busy the server is. Prometheus sends one (``authorization: {credentials_file: ...}`` in a
scrape config). A member key is a 403, no key a 401.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from app.live import Run
    from app.service import ResponseService

__all__ = ["CONTENT_TYPE", "Histogram", "Metrics", "StreamTiming"]

CONTENT_TYPE = CONTENT_TYPE_LATEST

#: Seconds: from a millisecond to a minute (time to first token, gaps, commits).
_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
#: Observations a histogram holds unsorted before they are folded into its buckets (at most a
#: few hundred KiB; a scrape folds them too).
_FOLD_AT = 8192
#: Events per commit.
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class Histogram:
    """A histogram for the hot path: ``observe`` is ``list.append`` (a C call, no lock, no
    arithmetic); the values are sorted into the buckets later, by :meth:`fold` (at a scrape,
    or when ``pending`` says enough wait), a bisect per bound over the sorted values. Observe
    from one thread (the event loop) only."""

    __slots__ = (
        "_bounds",
        "_count",
        "_cumulative",
        "_pending",
        "_sum",
        "documentation",
        "name",
        "observe",
    )

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self._bounds = tuple(float(b) for b in buckets)
        self._cumulative = [0] * len(self._bounds)  # observations <= each bound
        self._count = 0
        self._sum = 0.0
        self._pending: list[float] = []
        self.observe: Callable[[float], None] = self._pending.append

    @property
    def pending(self) -> int:
        return len(self._pending)

    def fold(self) -> None:
        pending = self._pending
        if not pending:
            return
        values = sorted(pending)
        pending.clear()
        for i, bound in enumerate(self._bounds):
            self._cumulative[i] += bisect.bisect_right(values, bound)
        self._count += len(values)
        self._sum += math.fsum(values)

    @property
    def count(self) -> int:
        self.fold()
        return self._count

    def exposition(self) -> str:
        """Its lines in Prometheus's text format, written directly (prometheus_client's
        ``generate_latest`` validates and escapes every sample: most of a scrape's time)."""
        self.fold()
        name = self.name
        lines = [f"# HELP {name} {self.documentation}\n# TYPE {name} histogram\n"]
        for bound, count in zip(self._bounds, self._cumulative, strict=True):
            lines.append(f'{name}_bucket{{le="{bound!r}"}} {count}\n')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self._count}\n')
        lines.append(f"{name}_count {self._count}\n{name}_sum {self._sum!r}\n")
        return "".join(lines)

    def family(self) -> HistogramMetricFamily:
        self.fold()
        buckets: list[tuple[str, float]] = [
            (repr(bound), count)
            for bound, count in zip(self._bounds, self._cumulative, strict=True)
        ]
        buckets.append(("+Inf", self._count))
        family = HistogramMetricFamily(self.name, self.documentation)
        family.add_metric([], buckets, self._sum)
        return family


class StreamTiming:
    """Times what a client of a live response receives, observed when a batch is published
    (after its commit): the first batch with output (time to first token, from the request's
    arrival) and the gap between batches with output (inter-event latency)."""

    __slots__ = (
        "commit_clock",
        "committed_at",
        "first",
        "gap",
        "inter_event",
        "time_to_first_token",
    )

    def __init__(self) -> None:
        #: Whether the store reports its commits (then a writer told of its commit takes the
        #: time from ``committed_at``, read once per commit for all its writers).
        self.commit_clock = False
        #: When the latest commit was done (``time.monotonic``).
        self.committed_at = 0.0
        self.time_to_first_token = Histogram(
            "ledger_time_to_first_token_seconds",
            "From the request's arrival to its first output event (any after "
            "response.in_progress) being durable and sent to its streams.",
            _LATENCY_BUCKETS,
        )
        self.inter_event = Histogram(
            "ledger_inter_event_latency_seconds",
            "Between two consecutive batches of output events a response's streams receive "
            "(each batch: the events of one commit).",
            _LATENCY_BUCKETS,
        )
        #: Their ``observe`` (one attribute look-up less on the path).
        self.first = self.time_to_first_token.observe
        self.gap = self.inter_event.observe


class Metrics:
    """This app's metrics (one registry per app, so several apps in one process do not mix)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.registry = CollectorRegistry(auto_describe=False)
        self.stream = StreamTiming()
        self.commit_latency = Histogram(
            "ledger_commit_latency_seconds",
            "From the first write of a group commit's batch being queued to the batch being "
            "durable (the wait for the commit before it, and retries, included).",
            _LATENCY_BUCKETS,
        )
        self.commit_batch = Histogram(
            "ledger_commit_batch_events", "Events written by one group commit.", _BATCH_BUCKETS
        )
        self.responses = Counter(
            "ledger_responses",
            "Responses that ended here, by final status and model.",
            ["model", "status"],
            registry=self.registry,
        )
        self.resumes = Counter(
            "ledger_resumes",
            "Streams of an existing response (GET ?stream=true, with or without starting_after).",
            registry=self.registry,
        )
        self.auth_failures = Counter(
            "ledger_auth_failures",
            "Requests refused for their key: missing, invalid (unknown or revoked), or not an "
            "admin's where one is needed.",
            ["reason"],
            registry=self.registry,
        )
        self._histograms = (
            self.stream.time_to_first_token,
            self.stream.inter_event,
            self.commit_latency,
            self.commit_batch,
        )
        self._service: ResponseService | None = None
        self.registry.register(_Collector(self))

    def attach(self, service: ResponseService) -> None:
        """Read the totals of ``service`` (and its store) at scrape time; observe its commits."""
        self._service = service
        if self.enabled and hasattr(service.store, "commit_observer"):
            service.store.commit_observer = self.commit_observer()
            self.stream.commit_clock = True

    def commit_observer(self) -> Callable[[int, float, float], None]:
        """What the store calls after each commit: its events, when its batch's first write
        was queued, when it was done (a closure: its look-ups are cells, not attributes)."""
        stream = self.stream
        latency, batch = self.commit_latency.observe, self.commit_batch.observe
        pending = self.commit_latency._pending
        fold = self._fold

        def observe_commit(events: int, first_at: float, done_at: float) -> None:
            stream.committed_at = done_at
            latency(done_at - first_at)
            batch(events)
            if len(pending) >= _FOLD_AT:
                fold()

        return observe_commit

    def _fold(self) -> None:
        for histogram in self._histograms:
            histogram.fold()

    def run_ended(self, run: Run, _task: Any = None) -> None:
        """Count a run when its task ends (a task done callback): its Response's status; a
        run that stopped without a terminal event counts ``failed`` (the repair loop closes it
        so), one handed to another replica is counted there."""
        if (
            self.stream.inter_event.pending >= _FOLD_AT
            or self.stream.time_to_first_token.pending >= _FOLD_AT
        ):
            self._fold()  # store=false responses have no commit to fold their timings
        if run.handed_off:
            return
        final = run.final_response
        status = final.get("status", "failed") if final is not None else "failed"
        self.responses.labels(run.model, status).inc()

    def scrape(self) -> bytes:
        """The exposition: the ledger's histograms and registry, then the global registry
        (vLLM's, the process's)."""
        histograms = "".join(histogram.exposition() for histogram in self._histograms)
        return histograms.encode() + generate_latest(self.registry) + generate_latest(REGISTRY)

    def _families(self) -> Iterator[Any]:
        service = self._service
        if service is None:
            return
        store: Any = service.store
        stats = getattr(store, "stats", None)
        if stats is not None:
            yield _counter("ledger_commits", "Write transactions committed.", stats.transactions)
            yield _counter("ledger_events_appended", "Events committed to the logs.", stats.events)
        yield _counter(
            "ledger_store_errors",
            "Commit attempts the database failed (unavailable, or refusing a batch's data).",
            getattr(store, "commit_errors", 0),
        )
        yield _counter(
            "ledger_store_retries",
            "Commit attempts retried while the database was unavailable.",
            getattr(store, "commit_retries", 0),
        )
        yield _counter(
            "ledger_fence_row_checks",
            "Logs whose epoch a PostgreSQL commit read and locked row by row: a log taken over "
            "here, or any log after a claim or delete of one of this replica's responses; "
            "streaming its own responses adds none (one lock of its replica's row a commit).",
            getattr(store, "fence_row_checks", 0),
        )
        yield _counter(
            "ledger_one_trip_commits",
            "PostgreSQL commits made in one statement, one round trip: a batch of this "
            "replica's own logs (a stream's steps, new responses, their ends) whose values take "
            "up to 64 MiB.",
            getattr(store, "one_trip_commits", 0),
        )
        yield _gauge(
            "ledger_store_writable",
            "1 while the database takes writes, 0 while it fails (see /health).",
            0 if store.health.failing else 1,
        )
        yield _gauge("ledger_live_streams", "SSE streams being served now.", service.open_streams)
        yield _gauge(
            "ledger_followers",
            "Streams following a log written elsewhere (another replica, the repair loop).",
            service.followers,
        )
        yield _gauge(
            "ledger_live_responses", "Responses being generated here now.", len(service.live_runs())
        )
        yield _counter(
            "ledger_takeovers",
            "Orphaned responses claimed here, by outcome (continued from their log, or closed "
            "failed).",
            None,
            labels=("outcome",),
            values=(
                ("continued", service.takeovers.continued),
                ("failed", service.takeovers.failed),
            ),
        )
        yield _gauge(
            "ledger_draining", "1 once a SIGTERM started the drain.", int(service.drain.draining)
        )
        yield _counter(
            "ledger_drain_handed_off",
            "Responses a drain handed to the other replicas.",
            service.drain.handed_off,
        )


class _Collector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Any]:
        return self._metrics._families()


def _counter(
    name: str,
    documentation: str,
    value: float | None,
    *,
    labels: Sequence[str] = (),
    values: Iterable[tuple[str, float]] = (),
) -> CounterMetricFamily:
    if value is not None:
        return CounterMetricFamily(name, documentation, value=value)
    family = CounterMetricFamily(name, documentation, labels=list(labels))
    for label, count in values:
        family.add_metric([label], count)
    return family


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
