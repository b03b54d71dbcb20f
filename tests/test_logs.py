"""``app.logs``: the JSON formatter and the log configuration."""

from __future__ import annotations

import io
import json
import logging

import pytest

from app.logs import JsonFormatter, configure
from app.settings import Settings


def test_a_record_is_one_json_object_with_its_extra_fields_and_traceback() -> None:
    formatter = JsonFormatter()
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.getLogger("t").makeRecord(
            "t", logging.ERROR, __file__, 1, "response %s failed", ("resp_1",), sys.exc_info(),
            extra={"response_id": "resp_1", "event": "request"},
        )  # fmt: skip
    line = formatter.format(record)
    assert "\n" not in line
    data = json.loads(line)
    assert data["message"] == "response resp_1 failed"
    assert data["level"] == "error" and data["logger"] == "t"
    assert data["response_id"] == "resp_1" and data["event"] == "request"
    assert "ValueError: boom" in data["exception"]


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_configure_sets_the_root_handler_format_and_level(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    try:
        configure("warning", fmt)
        logging.getLogger("app.x").info("hidden")
        logging.getLogger("uvicorn.error").warning("shown %d", 1)
        lines = stream.getvalue().splitlines()
        assert len(lines) == 1
        if fmt == "json":
            assert json.loads(lines[0])["message"] == "shown 1"
        else:
            assert lines[0].endswith("WARNING uvicorn.error: shown 1")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_the_log_format_setting() -> None:
    assert Settings.from_env({"RESPONSES_LEDGER_LOG_FORMAT": "TEXT"}).log_format == "text"
    assert Settings.from_env({}).log_format == "json"
    with pytest.raises(ValueError, match="RESPONSES_LEDGER_LOG_FORMAT"):
        Settings.from_env({"RESPONSES_LEDGER_LOG_FORMAT": "xml"})
