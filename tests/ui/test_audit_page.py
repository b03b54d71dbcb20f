"""The audit page (``app.ui``) in a real browser: Debian's Chromium driven by Playwright.

Responses are made with the openai SDK; the page is then used as an operator would: sign in
(HTTP Basic, the admin key), filter the list, open a response, read its prompt, follow its chain,
replay it and download its log. Screenshots are kept under tests/artifacts/ui/ (printed).
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from openai import OpenAI

from app.engines.scripted import ScriptedEngine
from tests.support.server import RunningServer
from tests.ui.conftest import ADMIN_KEY, MODEL, screenshot

ANSWER = "The answer is forty-two, said slowly and one token at a time."
#: Prompt text is user data: the page must show it, never run it.
HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


def _completion(reasoning: str, final: str) -> str:
    return (
        f"<|channel|>analysis<|message|>{reasoning}<|end|>"
        f"<|start|>assistant<|channel|>final<|message|>{final}<|return|>"
    )


def test_find_open_and_replay_a_response(
    page: Any, admin_client: OpenAI, ui_engine: ScriptedEngine, ui_server: RunningServer
) -> None:
    marker = f"audit-marker-{time.monotonic_ns()}"
    ui_engine.add_turns(
        {"completion": _completion("Thinking it over.", ANSWER), "token_delay_ms": 25},
        {"completion": _completion("Again.", "Still forty-two."), "token_delay_ms": 0},
    )
    first = admin_client.responses.create(model=MODEL, input=f"{marker} {HOSTILE}", stream=False)
    assert first.output_text == ANSWER
    second = admin_client.responses.create(
        model=MODEL, input="and again?", previous_response_id=first.id
    )
    admin_client.responses.create(model=MODEL, input="an unrelated one")

    # the list, filtered by text: only the marked response
    page.goto("/ui")
    assert page.locator(f'tr[data-id="{second.id}"]').count() == 1
    page.fill('input[name="q"]', marker)
    page.select_option('select[name="status"]', "completed")
    page.click('button[type="submit"]')
    page.wait_for_url(re.compile(r"/ui\?.*q=audit-marker"))
    rows = page.locator("#responses tbody tr")
    assert rows.count() == 1
    assert rows.first.get_attribute("data-id") == first.id
    screenshot(page, "list-filtered")
    page.select_option('select[name="status"]', "failed")
    page.click('button[type="submit"]')
    assert page.locator("#no-responses").is_visible()
    page.go_back()

    # one response
    page.click(f'a[href="/ui/responses/{first.id}"]')
    page.wait_for_selector("#response-id")
    assert page.text_content("#status") == "completed"
    prompt = page.text_content("#prompt")
    assert HOSTILE in prompt and prompt.startswith("<|start|>system<|message|>")
    assert page.evaluate("window.__pwned") is None  # shown, never run
    audit = httpx.get(
        f"{ui_server.base_url}/v1/responses/{first.id}/events",
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    ).json()["audit"]
    prompt_ids = next(a["token_ids"] for a in audit if a["kind"] == "prompt_token_ids")
    output_ids = next(a["token_ids"] for a in audit if a["kind"] == "output_token_ids")
    assert int(page.text_content("#prompt-count")) == len(prompt_ids) == first.usage.input_tokens
    assert page.text_content("#output-ids").split() == [str(i) for i in output_ids]
    assert ANSWER in page.text_content("#output .item-message")
    assert page.text_content("#output .item-message .phase") == "final_answer"
    assert "Thinking it over." in page.text_content("#output .item-reasoning")
    assert json.loads(page.text_content("#usage"))["output_tokens"] == first.usage.output_tokens
    assert page.locator("#timeline circle.commit").count() >= 5  # one dot per commit, paced
    assert page.locator("#timeline line.ttft").count() == 1
    screenshot(page, "response")

    # replay at the recorded pace, through the resume endpoint
    times = json.loads(page.text_content("#replay-data"))["times"]
    recorded_s = times[-1] / 1000
    assert recorded_s > 0.4  # ~30 tokens, 25 ms apart
    started = time.monotonic()
    page.click("#replay")
    page.wait_for_selector("#replay-state[data-finished]", timeout=30_000)
    replayed_s = time.monotonic() - started
    assert page.text_content("#replay-output .part.text") == ANSWER
    assert page.text_content("#replay-output .part.reasoning") == "Thinking it over."
    assert replayed_s >= 0.8 * recorded_s, (replayed_s, recorded_s)
    screenshot(page, "replayed")

    # the log as JSON lines: what `responses-ledger events` prints
    with page.expect_download() as download:
        page.click("#download")
    text = Path(download.value.path()).read_text(encoding="utf-8")
    lines = [json.loads(line) for line in text.splitlines()]
    events = [line for line in lines if "seq" in line]
    assert [e["seq"] for e in events] == list(range(len(times)))
    assert events[-1]["type"] == "response.completed"
    assert [line["audit"] for line in lines if "audit" in line][:1] == ["prompt_token_ids"]

    # the chain, both ways
    page.click(f'a.chain-later[href="/ui/responses/{second.id}"]')
    page.wait_for_selector("#response-id")
    assert page.text_content("#response-id") == second.id
    assert page.locator(f'a.chain-earlier[href="/ui/responses/{first.id}"]').count() == 1
    assert "and again?" in page.text_content("#inputs")


def test_a_conversations_turns_link_to_each_other(page: Any, admin_client: OpenAI) -> None:
    conversation = admin_client.conversations.create()
    one = admin_client.responses.create(
        model=MODEL, input="first turn", conversation=conversation.id
    )
    two = admin_client.responses.create(
        model=MODEL, input="second turn", conversation=conversation.id
    )
    page.goto(f"/ui/responses/{two.id}")
    assert page.text_content("#conversation") == conversation.id
    page.click(f'#turns a[href="/ui/responses/{one.id}"]')
    page.wait_for_selector("#response-id")
    assert page.text_content("#response-id") == one.id
    assert page.locator(f'#turns a[href="/ui/responses/{two.id}"]').count() == 1


def test_the_page_is_for_admin_keys_only(ui_server: RunningServer, ui_db: tuple[str, str]) -> None:
    member_key = ui_db[1]
    base = ui_server.base_url
    with httpx.Client(base_url=base, timeout=30) as http:
        for path in ("/ui", "/ui/responses/resp_x", "/ui/responses/resp_x/stream?stream=true"):
            refused = http.get(path)
            assert refused.status_code == 401
            assert refused.headers["www-authenticate"].startswith("Basic ")
        assert http.get("/ui", auth=("admin", "sk-rl-wrong")).status_code == 401
        member = http.get("/ui", auth=("me", member_key))
        assert member.status_code == 403
        assert member.json()["error"]["code"] == "admin_only"
        assert http.get("/ui", auth=("anyone", ADMIN_KEY)).status_code == 200
        bearer = http.get("/ui", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert bearer.status_code == 200 and "text/html" in bearer.headers["content-type"]
        missing = http.get("/ui/responses/resp_missing", auth=("a", ADMIN_KEY))
        assert missing.status_code == 404
        bad = http.get("/ui", params={"since": "yesterday"}, auth=("a", ADMIN_KEY))
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "since"


def test_a_filter_the_page_does_not_take_is_a_400_naming_it(
    admin_client: OpenAI, ui_server: RunningServer
) -> None:
    """``/ui?from=...`` (the filter is ``since``) showed every response as if filtered; a
    filter given twice took the last. Both are a 400 now, on every page (``app.ui.QUERIES``)."""
    made = admin_client.responses.create(model=MODEL, input="query names")
    with httpx.Client(base_url=ui_server.base_url, auth=("a", ADMIN_KEY), timeout=30) as http:
        for path, query, param in (
            ("/ui", "from=2026-12-01", "from"),
            ("/ui", "status=completed&status=failed", "status"),
            (f"/ui/responses/{made.id}", "raw=1", "raw"),
            (f"/ui/responses/{made.id}/log.jsonl", "gzip=1", "gzip"),
            (f"/ui/responses/{made.id}/stream", "stream=true&starting_afer=2", "starting_afer"),
        ):
            refused = http.get(f"{path}?{query}")
            assert refused.status_code == 400, (path, query, refused.text)
            assert refused.json()["error"]["param"] == param
        assert made.id in http.get("/ui?status=completed&q=query+names").text
        resumed = http.get(f"/ui/responses/{made.id}/stream?stream=true&starting_after=2")
        assert resumed.status_code == 200
        first = next(line for line in resumed.text.splitlines() if line.startswith("data: "))
        assert json.loads(first.removeprefix("data: "))["sequence_number"] == 3


def test_an_admin_sees_every_project(
    ui_server: RunningServer, ui_db: tuple[str, str], ui_engine: ScriptedEngine
) -> None:
    """A member's response (project alpha) is on the page and replays for the admin, though
    ``/v1`` shows it only to alpha's keys."""
    with OpenAI(base_url=ui_server.base_url + "/v1", api_key=ui_db[1], max_retries=0) as member:
        made = member.responses.create(model=MODEL, input="alpha's own")
    with httpx.Client(base_url=ui_server.base_url, auth=("a", ADMIN_KEY), timeout=30) as http:
        listed = http.get("/ui", params={"project": "alpha"})
        assert made.id in listed.text
        at = datetime.fromtimestamp(made.created_at, UTC).replace(tzinfo=None)
        window = {"since": at.isoformat(), "until": (at + timedelta(seconds=1)).isoformat()}
        assert made.id in http.get("/ui", params=window).text  # the page's UTC date-times
        assert made.id not in http.get("/ui", params={"until": at.isoformat()}).text
        assert made.id in http.get("/ui", params={"since": str(int(made.created_at))}).text
        assert made.id not in http.get("/ui", params={"project": "default"}).text
        shown = http.get(f"/ui/responses/{made.id}")
        assert shown.status_code == 200 and "alpha&#39;s own" in shown.text
        stream = http.get(f"/ui/responses/{made.id}/stream", params={"stream": "true"})
        assert stream.status_code == 200
        assert stream.text.rstrip().splitlines()[-2] == "event: response.completed"


def test_the_list_pages_newest_first(page: Any, admin_client: OpenAI, monkeypatch: Any) -> None:
    monkeypatch.setattr("app.ui.PAGE_SIZE", 2)  # the server runs in this process
    marker = f"paged-{time.monotonic_ns()}"
    made = [admin_client.responses.create(model=MODEL, input=f"{marker} {i}") for i in range(3)]
    newest_first = [r.id for r in sorted(made, key=lambda r: (r.created_at, r.id), reverse=True)]
    page.goto(f"/ui?q={marker}")
    ids = page.locator("#responses tbody tr").evaluate_all("rows => rows.map(r => r.dataset.id)")
    page.click('a[rel="next"]')
    page.wait_for_url(re.compile(r"page=2"))
    older = page.locator("#responses tbody tr").evaluate_all("rows => rows.map(r => r.dataset.id)")
    assert page.locator('a[rel="next"]').count() == 0
    # newest first (created_at is in seconds: within one second, by id)
    assert ids + older == newest_first
    page.click('a[rel="prev"]')
    page.wait_for_url(re.compile(r"page=1"))
    assert page.locator("#responses tbody tr").count() == 2


def test_a_response_whose_earlier_turn_was_deleted(
    admin_client: OpenAI, ui_server: RunningServer
) -> None:
    first = admin_client.responses.create(model=MODEL, input="soon gone")
    second = admin_client.responses.create(model=MODEL, input="left", previous_response_id=first.id)
    admin_client.responses.delete(first.id)
    with httpx.Client(base_url=ui_server.base_url, auth=("a", ADMIN_KEY), timeout=30) as http:
        shown = http.get(f"/ui/responses/{second.id}")
        assert shown.status_code == 200
        assert f'href="/ui/responses/{first.id}"' in shown.text and "cannot be read" in shown.text
        assert http.get(f"/ui/responses/{first.id}").status_code == 404
