"""The token-times side channel's file format: one file a process, a record appended a response."""

from __future__ import annotations

import os
import struct
from array import array

import pytest

from app.engines.echo import write_token_times
from bench import token_times


def test_round_trip_and_format(tmp_path):
    path = token_times.append(tmp_path, "resp_abc", [1, 2**40, -3])
    assert path == tmp_path / f"{os.getpid()}.times"
    assert path.read_bytes() == struct.pack("<H", 8) + b"resp_abc" + struct.pack(
        "<I3q", 3, 1, 2**40, -3
    )
    assert {k: list(v) for k, v in token_times.read_all(tmp_path).items()} == {
        "resp_abc": [1, 2**40, -3]
    }


def test_records_of_many_responses_and_processes_are_all_read(tmp_path):
    token_times.append(tmp_path, "resp_a", [1, 2])
    token_times.append(tmp_path, "resp_b", [])
    # another process's file, written as the ledger's scripted engine writes it
    (tmp_path / "1.times").write_bytes(token_times.encode_record("resp_c", [7]))
    write_token_times(tmp_path, "resp_d", array("q", [8, 9]))
    found = {k: list(v) for k, v in token_times.read_all(tmp_path).items()}
    assert found == {"resp_a": [1, 2], "resp_b": [], "resp_c": [7], "resp_d": [8, 9]}


def test_a_record_being_written_is_left_out(tmp_path):
    whole = token_times.encode_record("resp_a", [1, 2, 3])
    cut = token_times.encode_record("resp_b", [4, 5, 6])
    for upto in range(1, len(cut)):  # a reader may come at any byte of the append
        (tmp_path / "9.times").write_bytes(whole + cut[:upto])
        assert list(token_times.read_all(tmp_path)) == ["resp_a"]


def test_the_file_is_made_again_after_the_directory_is_cleared(tmp_path):
    """The harness clears the directory between runs of one server: later records must land."""
    token_times.append(tmp_path, "resp_a", [1])
    for path in tmp_path.iterdir():
        path.unlink()
    token_times.append(tmp_path, "resp_b", [2])
    assert {k: list(v) for k, v in token_times.read_all(tmp_path).items()} == {"resp_b": [2]}


def test_collector_is_a_no_op_without_a_directory():
    times = token_times.TokenTimes(None)
    times.mark()
    assert not times.enabled
    assert times.save("resp_x") is None


def test_collector_marks_chunks(tmp_path):
    times = token_times.TokenTimes(tmp_path)
    times.mark(now_ns=5)
    times.mark(3, now_ns=7)
    assert times.save("resp_y") is not None
    assert list(token_times.read_all(tmp_path)["resp_y"]) == [5, 7, 7, 7]


def test_an_empty_id_is_refused(tmp_path):
    with pytest.raises(ValueError):
        token_times.append(tmp_path, "", [1])
