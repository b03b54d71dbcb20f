"""The token-times side channel: when did the engine yield each output token?

Latency "from the engine yielding a token to the client reading it" needs a timestamp taken inside
the server. Rather than putting it on the wire (which would change the frames being measured), a
server under test writes it to a side file, and the load generator joins it with its own read
times after the run.

File format
-----------

When the environment variable ``BENCH_TOKEN_TIMES_DIR`` is set, each server process appends one
record per response to a file of its own::

    <BENCH_TOKEN_TIMES_DIR>/<pid>.times

A record is ``<H`` (the response id's length in bytes), the id (UTF-8: the ``response.id`` of
the stream's ``response.created`` event, e.g. ``resp_3f2a...``), ``<I`` (the number of tokens),
then that many little-endian signed 64-bit integers: entry ``i`` is ``time.monotonic_ns()``
(``CLOCK_MONOTONIC``, one clock for all processes on Linux) at the moment the engine yielded
output token ``i`` of that response, in engine order. When an engine yields several tokens in one
chunk, they all carry the chunk's time. A record is appended in one ``write`` (``O_APPEND``) no
later than the response's terminal event is sent; a reader ignores a record not yet whole.

Why one file a process, appended, and not a file a response: creating a file is a journal
transaction on ext4, and while a database on the same disk fsyncs, ``open(O_CREAT)`` of a new
file waited ~0.5 ms (the ledger's server spent that of each response's end in ``open``, blocking
its event loop, the naive peer 0.05 ms): the instrument disturbed what it measures, unequally.
Appending to a file that exists takes no new inode. The file is opened for each record (a few µs)
so that a reader that clears the directory between runs loses nothing written after. The writer
is the scripted engine's (``app.engines.echo.write_token_times``, which the ledger's server runs);
:func:`append` is that same function, for the naive peer and the tests.

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
import struct
import sys
from array import array
from pathlib import Path
from time import monotonic_ns

from app.engines.echo import token_times_record as encode_record
from app.engines.echo import write_token_times as append

__all__ = [
    "ENV_VAR",
    "SUFFIX",
    "TokenTimes",
    "append",
    "directory_from_env",
    "encode_record",
    "read_all",
]

ENV_VAR = "BENCH_TOKEN_TIMES_DIR"
SUFFIX = ".times"
_HEAD = struct.Struct("<H")
_COUNT = struct.Struct("<I")


def directory_from_env() -> Path | None:
    """The directory to write token times to, or ``None`` when the benchmark did not ask."""
    value = os.environ.get(ENV_VAR)
    return Path(value) if value else None


def read_all(directory: Path) -> dict[str, array]:
    """Every whole record of every process's file in ``directory``: response id -> its times
    (an ``array('q')`` of monotonic nanoseconds). A record cut short (being written) is left out."""
    found: dict[str, array] = {}
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        data = path.read_bytes()
        at = 0
        while at + _HEAD.size <= len(data):
            (size,) = _HEAD.unpack_from(data, at)
            count_at = at + _HEAD.size + size
            if count_at + _COUNT.size > len(data):
                break
            (count,) = _COUNT.unpack_from(data, count_at)
            end = count_at + _COUNT.size + 8 * count
            if end > len(data):
                break
            values = array("q")
            values.frombytes(data[count_at + _COUNT.size : end])
            if sys.byteorder != "little":
                values.byteswap()
            found[data[at + _HEAD.size : count_at].decode()] = values
            at = end
    return found


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
        return append(self._directory, response_id, self._times)
