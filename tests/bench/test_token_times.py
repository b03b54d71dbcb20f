"""The token-times side channel's file format."""

from __future__ import annotations

import struct

import pytest

from bench import token_times


def test_round_trip_and_format(tmp_path):
    path = token_times.write(tmp_path, "resp_abc", [1, 2**40, -3])
    assert path == tmp_path / "resp_abc.ns"
    assert path.read_bytes() == struct.pack("<3q", 1, 2**40, -3)
    assert list(token_times.read(path)) == [1, 2**40, -3]
    assert not list(tmp_path.glob("*.tmp"))


def test_collector_is_a_no_op_without_a_directory():
    times = token_times.TokenTimes(None)
    times.mark()
    assert not times.enabled
    assert times.save("resp_x") is None


def test_collector_marks_chunks(tmp_path):
    times = token_times.TokenTimes(tmp_path)
    times.mark(now_ns=5)
    times.mark(3, now_ns=7)
    path = times.save("resp_y")
    assert path is not None
    assert list(token_times.read(path)) == [5, 7, 7, 7]


def test_rejects_ids_that_would_escape_the_directory(tmp_path):
    with pytest.raises(ValueError):
        token_times.path_for(tmp_path, "../etc/passwd")


def test_reads_only_whole_int64s(tmp_path):
    bad = tmp_path / "resp_z.ns"
    bad.write_bytes(b"\x00" * 9)
    with pytest.raises(ValueError):
        token_times.read(bad)
