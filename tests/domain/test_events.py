"""The event values: built fast, still frozen dataclasses to everyone who uses them."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from domain.events import _CLASSES as CLASSES
from domain.events import OutputTextDelta, ResponseCompleted, event_class


@pytest.mark.parametrize("cls", list(CLASSES.values()), ids=lambda c: c.type)
def test_every_event_keeps_its_dataclass_signature_and_stays_frozen(cls: type) -> None:
    fields = dataclasses.fields(cls)
    values = {f.name: f"v{i}" for i, f in enumerate(fields)}
    by_keyword = cls(**values)
    by_position = cls(*values.values())
    assert by_keyword == by_position
    assert {f.name: getattr(by_keyword, f.name) for f in fields} == values
    assert dataclasses.astuple(by_keyword) == tuple(values.values())
    assert list(inspect.signature(cls).parameters) == [f.name for f in fields]
    with pytest.raises(dataclasses.FrozenInstanceError):
        by_keyword.sequence_number = 1  # type: ignore[attr-defined]
    assert event_class(cls.type) is cls


def test_defaults_and_missing_arguments_behave_as_before() -> None:
    delta = OutputTextDelta(3, "msg_1", 0, 0, "hi")
    assert delta.logprobs == ()
    assert delta == OutputTextDelta(
        sequence_number=3, item_id="msg_1", output_index=0, content_index=0, delta="hi"
    )
    assert hash(delta) == hash(OutputTextDelta(3, "msg_1", 0, 0, "hi"))
    assert repr(delta).startswith("OutputTextDelta(sequence_number=3, item_id='msg_1'")
    with pytest.raises(TypeError):
        ResponseCompleted(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        OutputTextDelta(3, "msg_1", 0, 0, "hi", (), "extra")  # type: ignore[call-arg]


def test_copy_json_is_a_deep_copy_of_json_data() -> None:
    from domain.events import copy_json

    original = {"a": [1, {"b": "x", "c": None}], "t": ({"d": 2.5},), "e": True}
    copied = copy_json(original)
    assert copied == original
    copied["a"][1]["b"] = "changed"
    copied["t"][0]["d"] = 0
    assert original == {"a": [1, {"b": "x", "c": None}], "t": ({"d": 2.5},), "e": True}
