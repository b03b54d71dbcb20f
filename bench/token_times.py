"""The token-times side channel: when did the engine yield each output token?

Latency "from the engine yielding a token to the client reading it" needs a timestamp taken inside
the server. Rather than putting it on the wire (which would change the frames being measured), a
server under test writes it to a side file, and the load generator joins it with its own read
times after the run.

File format
-----------

When the environment variable ``BENCH_TOKEN_TIMES_DIR`` is set, the server writes one file per
response::

    <BENCH_TOKEN_TIMES_DIR>/<response_id>.ns

``<response_id>`` is the ``response.id`` of the stream's ``response.created`` event (for example
``resp_3f2a...``). The content is a flat array of little-endian signed 64-bit integers, no header:
entry ``i`` is ``time.monotonic_ns()`` (``CLOCK_MONOTONIC``, which is one clock for all processes
on Linux) at the moment the engine yielded output token ``i`` of that response, in engine order.
When an engine yields several tokens in one chunk, they all carry the chunk's time. The file is
written whole (to ``<name>.tmp``, then renamed) no later than the response's terminal event is
sent, so a reader that has seen the terminal event finds either the complete file or none.

Matching (done by :mod:`bench.loadgen`): token ``i + offset`` is matched to the ``i``-th delta
event (any ``response.*.delta``) that the client read on that stream. ``offset`` is a property of
the target: the number of leading output tokens that produce no delta (for a scripted Harmony
completion ``<|channel|>final<|message|>TEXT<|return|>`` it is 3: ``<|channel|>``, ``final``,
``<|message|>``). Trailing tokens without a delta (``<|return|>``) are simply left unmatched. The
pairing is exact only when every content token produces exactly one delta, so benchmark scripts
use plain ASCII words.

Writers record tokens only when the variable is set; the cost of one ``monotonic_ns()`` call and an
``array.append`` per token is well under a microsecond.
"""

from __future__ import annotations

import os
import sys
from array import array
from pathlib import Path
from time import monotonic_ns

__all__ = ["ENV_VAR", "SUFFIX", "TokenTimes", "directory_from_env", "path_for", "read", "write"]

ENV_VAR = "BENCH_TOKEN_TIMES_DIR"
SUFFIX = ".ns"


def directory_from_env() -> Path | None:
    """The directory to write token times to, or ``None`` when the benchmark did not ask."""
    value = os.environ.get(ENV_VAR)
    return Path(value) if value else None


def path_for(directory: Path, response_id: str) -> Path:
    if not response_id or "/" in response_id or response_id.startswith("."):
        raise ValueError(f"not a usable response id: {response_id!r}")
    return directory / f"{response_id}{SUFFIX}"


def _to_little_endian(values: array) -> bytes:
    if sys.byteorder == "little":
        return values.tobytes()
    swapped = array("q", values)
    swapped.byteswap()
    return swapped.tobytes()


def write(directory: Path, response_id: str, times_ns: array | list[int]) -> Path:
    """Write one response's token times atomically; returns the file's path."""
    if isinstance(times_ns, array) and times_ns.typecode == "q":
        values = times_ns
    else:
        values = array("q", times_ns)
    path = path_for(directory, response_id)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(_to_little_endian(values))
    os.replace(tmp, path)
    return path


def read(path: Path) -> array:
    """Read a token-times file into an ``array('q')`` of monotonic nanoseconds."""
    data = path.read_bytes()
    if len(data) % 8:
        raise ValueError(f"{path}: size {len(data)} is not a multiple of 8")
    values = array("q")
    values.frombytes(data)
    if sys.byteorder != "little":
        values.byteswap()
    return values


class TokenTimes:
    """Collects one response's token times; a no-op when the directory is ``None``.

    Usage in an engine loop::

        times = TokenTimes(directory_from_env())
        for token in tokens:
            times.mark()          # or times.mark(len(chunk.token_ids))
            ...
        times.save(response_id)
    """

    __slots__ = ("_directory", "_times")

    def __init__(self, directory: Path | None) -> None:
        self._directory = directory
        self._times: array | None = array("q") if directory is not None else None

    @property
    def enabled(self) -> bool:
        return self._times is not None

    def mark(self, count: int = 1, now_ns: int | None = None) -> None:
        """Record that ``count`` tokens were yielded now (or at ``now_ns``)."""
        times = self._times
        if times is None:
            return
        t = monotonic_ns() if now_ns is None else now_ns
        if count == 1:
            times.append(t)
        else:
            times.extend([t] * count)

    def save(self, response_id: str) -> Path | None:
        if self._times is None or self._directory is None:
            return None
        return write(self._directory, response_id, self._times)
