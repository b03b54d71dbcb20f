"""Ids in the order they were made, OpenAI's shape, unguessable (``app.ids``)."""

from __future__ import annotations

import os
import re
import threading
import time

from app import ids
from app.ids import new_id

#: What ``new_id`` makes (also checked on the ids the server gives out, ``tests/e2e/test_ids.py``).
SHAPE = re.compile(
    r"(?P<prefix>[a-z]+)_(?P<seconds>[0-9a-f]{8})(?P<micros>[0-9a-f]{5})[0-9a-f]{35}"
)


def test_an_id_is_the_prefix_the_time_and_random_hex_digits() -> None:
    before = int(time.time())
    made = new_id("resp")
    after = int(time.time())
    match = SHAPE.fullmatch(made)
    assert match is not None and len(made) == len("resp_") + 48, made
    assert match["prefix"] == "resp"
    assert before <= int(match["seconds"], 16) <= after  # OpenAI's first 8 digits: Unix seconds
    assert int(match["micros"], 16) < 1_000_000


def test_ids_sort_in_the_order_they_were_made_and_never_repeat() -> None:
    made = [new_id("msg") for _ in range(50_000)]  # many in one microsecond: still in order
    assert made == sorted(made)
    assert len(set(made)) == len(made)
    # and the random part is random: no two of them share it
    assert len({m[-35:] for m in made}) == len(made)


def test_a_clock_set_back_does_not_make_an_earlier_id(monkeypatch) -> None:
    first = new_id("resp")
    monkeypatch.setattr(ids, "_clock", lambda: 1_000_000_000 * 1_000_000_000)  # 2001
    second = new_id("resp")
    assert second > first and SHAPE.fullmatch(second)


def test_ids_made_in_threads_are_all_different_and_each_threads_in_order() -> None:
    made: dict[int, list[str]] = {}

    def make(k: int) -> None:
        made[k] = [new_id("item") for _ in range(5_000)]

    threads = [threading.Thread(target=make, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [m for k in made for m in made[k]]
    assert len(set(every)) == len(every) == 20_000
    assert all(made[k] == sorted(made[k]) for k in made)


def test_a_forked_child_does_not_reuse_its_parents_random_bytes() -> None:
    new_id("resp")  # the parent's buffer holds bytes its next ids will use
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        try:
            os.write(write, new_id("resp").encode())
        finally:
            os._exit(0)
    os.close(write)
    child = b""
    while chunk := os.read(read, 100):
        child += chunk
    os.close(read)
    os.waitpid(pid, 0)
    parents = new_id("resp")
    assert SHAPE.fullmatch(child.decode())
    assert child.decode()[-35:] != parents[-35:]
