from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.encoding import load_encoding
from domain.prompt import PromptRequest, RenderedPrompt, render_prompt
from domain.truncation import cut_points, drop_oldest, fit, truncation_audit

ENCODING = load_encoding()


def user(text: str, id_: str | None = None) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text, **({"id": id_} if id_ else {})}


def call(call_id: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": "lookup",
        "arguments": "{}",
        "id": f"fc_{call_id}",
    }


def output(call_id: str, text: str = "result") -> dict[str, Any]:
    return {
        "type": "function_call_output",
        "call_id": call_id,
        "output": text,
        "id": f"fco_{call_id}",
    }


def test_a_call_and_its_output_are_never_cut_apart_and_the_last_item_stays() -> None:
    items = [user("a"), call("c1"), user("between"), output("c1"), user("b")]
    # dropping 2 or 3 would keep output c1 without its call; dropping all 5 would leave nothing
    assert cut_points(items) == [0, 1, 4]


def test_system_and_developer_messages_are_never_dropped() -> None:
    items = [
        {"role": "system", "content": "sys"},
        user("old", "u0"),
        {"type": "message", "role": "developer", "content": "dev"},
        user("new", "u1"),
    ]
    kept, history, dropped = drop_oldest(items, 1, history_length=3)
    assert [i["content"] for i in kept] == ["sys", "dev", "new"]
    assert history == 2 and [i["id"] for i in dropped] == ["u0"]
    assert cut_points(items) == [0, 1]


def test_an_item_reference_counts_as_the_item_it_names() -> None:
    target = call("c9")
    items = [user("a"), {"type": "item_reference", "id": "fc_c9"}, output("c9"), user("b")]
    assert cut_points(items, {"fc_c9": target}.get) == [0, 1, 3]


def _measure(items: Sequence[Any], history: int) -> RenderedPrompt:
    return render_prompt(
        ENCODING, PromptRequest(instructions="Be brief.", items=list(items), history_length=history)
    )


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from(["user", "pair", "dev"]), min_size=1, max_size=12),
    st.integers(min_value=60, max_value=400),
)
def test_fit_drops_the_fewest_oldest_items_that_make_it_fit(shape: list[str], limit: int) -> None:
    items: list[dict[str, Any]] = []
    for k, kind in enumerate(shape):
        if kind == "pair":
            items += [call(f"c{k}"), output(f"c{k}", "x " * 20)]
        elif kind == "dev":
            items.append({"type": "message", "role": "developer", "content": f"rule {k}"})
        items.append(user(f"message number {k} " + "y " * k, f"u{k}"))

    def fits(r: RenderedPrompt) -> bool:
        return len(r.token_ids) <= limit

    found = fit(items, 0, _measure, fits)
    points = cut_points(items)
    lengths = {n: len(_measure(drop_oldest(items, n, 0)[0], 0).token_ids) for n in points}
    assert all(a >= b for a, b in zip(lengths.values(), list(lengths.values())[1:], strict=False))
    if found is None:
        assert lengths[points[-1]] > limit
        return
    assert fits(found.result)
    assert found.dropped in points
    assert all(lengths[n] > limit for n in points if n < found.dropped)  # no fewer would do
    assert found.items[-1] == items[-1]
    assert [i for i in items if i.get("role") == "developer"] == [
        i for i in found.items if i.get("role") == "developer"
    ]
    kept_calls = {i["call_id"] for i in found.items if i["type"] == "function_call"}
    assert all(
        i["call_id"] in kept_calls for i in found.items if i["type"] == "function_call_output"
    )
    assert truncation_audit(found)["truncation"] == {
        "dropped_items": found.dropped,
        "dropped_ids": list(found.dropped_ids),
    }
    assert truncation_audit(None) == {}
