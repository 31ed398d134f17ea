"""The dashboard's governance pages in a real headless browser (as tests/web/test_web.py): each
object's history and the difference between two revisions, the incidents page with acknowledge
and resolve, and the overview's count of open incidents — the incident itself raised by the
server's background evaluation (a GPU marked unhealthy), with no call to evaluate."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.service.alerts import INTERVAL_ENV
from tests.test_service_support import Server, wait_for

# the browser fixture, and the skip (or failure) without one: tests/conftest.py
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    before = os.environ.get(INTERVAL_ENV)
    os.environ[INTERVAL_ENV] = "0.2"  # the child server evaluates its alerts every 0.2 s
    srv = Server(tmp_path_factory.mktemp("gov") / "state", time_scale=1.0)
    try:
        srv.start()
    finally:
        os.environ.pop(INTERVAL_ENV) if before is None else os.environ.__setitem__(INTERVAL_ENV, before)
    try:
        yield srv
    finally:
        srv.stop()


def _signed_in(server: Server, browser: Any, token: str | None = None) -> Any:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(server.base + "/ui/")
    page.fill("#token", token or server.token)
    page.click("#login button")
    sync_api.expect(page.locator("#who")).not_to_be_empty()
    return page


def _h(server: Server) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.token}"}


def test_an_objects_page_shows_its_history_and_a_chosen_diff(server: Server, browser: Any) -> None:
    base, h = server.base, _h(server)
    q = httpx.get(f"{base}/v1/config/queues/llm-research", headers=h).json()
    q["metadata"].pop("resourceVersion", None)
    q["spec"]["weight"] = 3
    r = httpx.put(f"{base}/v1/config/queues/llm-research", params={"reason": "more share"}, json=q, headers=h)
    assert r.status_code == 200, r.text
    q["spec"]["weight"] = 4
    assert httpx.put(f"{base}/v1/config/queues/llm-research", json=q, headers=h).status_code == 200
    page = _signed_in(server, browser)
    page.locator("#quota tbody a", has_text="llm-research").first.click()  # from the queue tree
    sync_api.expect(page.locator("#obj-title")).to_have_text("Queue llm-research")
    rows = page.locator("#obj-history tbody tr")
    sync_api.expect(rows).to_have_count(3)  # newest first
    sync_api.expect(rows.first.locator("td").first).to_have_text("3")
    sync_api.expect(page.locator("#obj-history tr[data-revision='2']")).to_contain_text("more share")
    sync_api.expect(page.locator("#obj-history tr[data-revision='1']")).to_contain_text("system")
    # the default difference is the latest against the one before it
    sync_api.expect(page.locator("#obj-changes tbody")).to_contain_text("spec.weight")
    change = page.locator("#obj-changes tbody tr").first.locator("td")
    sync_api.expect(change).to_have_text(["spec.weight", "3", "4"])
    page.select_option("#obj-diff-form select[name=from]", "1")
    page.select_option("#obj-diff-form select[name=to]", "2")
    page.click("#obj-diff-form button")
    sync_api.expect(page.locator("#obj-diff")).to_contain_text("Queue/llm-research@1")
    sync_api.expect(page.locator("#obj-diff")).to_contain_text("+  weight: 3")
    # every kind is reachable from the configuration page, a cluster and a priority class too
    page.click("header a[href='#/config']")
    for plural in ("pools", "queues", "priorityclasses", "clusters"):
        sync_api.expect(page.locator(f".config-kind[data-plural={plural}] li").first).to_be_visible()
    page.locator(".config-kind[data-plural=clusters] a").first.click()
    sync_api.expect(page.locator("#obj-title")).to_have_text("Cluster demo")
    sync_api.expect(page.locator("#obj-history tbody tr")).to_have_count(1)
    sync_api.expect(page.locator("#obj-diff-form")).to_be_hidden()  # one revision: nothing to compare


def test_incidents_raised_in_the_background_are_handled_from_the_ui(
    server: Server, browser: Any, tmp_path: Path
) -> None:
    base, h = server.base, _h(server)
    r = httpx.post(
        f"{base}/v1/nodes/l40s-001/devices/3/health", json={"healthy": False, "reason": "XID 79"}, headers=h
    )
    assert r.status_code == 200, r.text
    open_ = lambda: httpx.get(f"{base}/v1/alerts?open=true&evaluate=false", headers=h).json()["items"]  # noqa: E731
    [inc] = wait_for(open_, 10, "the background loop to open an incident")
    assert (inc["rule"], inc["subject"]) == ("GPUUnhealthy", "node/l40s-001/gpu/3")
    page = _signed_in(server, browser)
    sync_api.expect(page.locator("#incident-count")).to_contain_text("1 open incident")
    page.click("#incident-count a")
    row = page.locator(f"#incidents tr[data-id='{inc['id']}']")
    sync_api.expect(row).to_contain_text("Firing")
    row.locator("input[name=owner]").fill("gpu-oncall")
    row.get_by_role("button", name="acknowledge").click()
    sync_api.expect(row).to_contain_text("Acknowledged")
    sync_api.expect(row).to_contain_text("gpu-oncall")
    row.get_by_role("button", name="resolve").click()  # without a note: refused, says why
    sync_api.expect(page.locator("#error")).to_contain_text("note is required")
    row.locator("input[name=note]").fill("reseated the card")
    row.get_by_role("button", name="resolve").click()
    sync_api.expect(page.locator(f"#incidents tr[data-id='{inc['id']}']")).to_have_count(0)  # open only
    page.select_option("#incident-state", "Resolved")
    sync_api.expect(row).to_contain_text("reseated the card")
    page.screenshot(path=str(tmp_path / "incidents.png"), full_page=True)
    page.click("header a.home")
    # the device is still unhealthy: the loop opens a new incident, counted on the overview
    sync_api.expect(page.locator("#incident-count")).to_contain_text("1 open incident", timeout=15000)


def test_a_slow_answer_for_the_page_left_does_not_clear_the_error_of_the_page_shown(
    server: Server, browser: Any
) -> None:
    """The overview's refresh still waiting on /v1/history when the user opens the incidents
    page must not clear that page's error when it finally answers (it did: the incidents page
    of a member flashed its 'platform admins' message, then showed none)."""
    r = httpx.post(
        f"{server.base}/v1/tokens",
        json={"name": "m2", "role": "member", "scope": "llm-research"},
        headers=_h(server),
    )
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    held: list[Any] = []
    page.route("**/v1/history*", lambda route: held.append(route))  # answered only when released
    page.goto(server.base + "/ui/")
    page.fill("#token", r.json()["token"])
    page.click("#login button")
    sync_api.expect(page.locator("#who")).to_contain_text("member")
    page.wait_for_function("() => true")  # let the overview's requests go out
    assert held, "the overview asked for its history"
    page.goto(server.base + "/ui/#/incidents")
    sync_api.expect(page.locator("#error")).to_contain_text("platform admins")
    with page.expect_response("**/v1/history*"):
        held[0].continue_()
    page.wait_for_timeout(300)  # the old refresh's last step after its answer
    sync_api.expect(page.locator("#error")).to_contain_text("platform admins")


def test_a_member_sees_history_but_not_the_incidents(server: Server, browser: Any) -> None:
    r = httpx.post(
        f"{server.base}/v1/tokens",
        json={"name": "m", "role": "member", "scope": "llm-research"},
        headers=_h(server),
    )
    page = _signed_in(server, browser, r.json()["token"])
    sync_api.expect(page.locator("#who")).to_contain_text("member")
    sync_api.expect(page.locator("#incident-count")).to_be_hidden()
    page.goto(server.base + "/ui/#/incidents")
    sync_api.expect(page.locator("#error")).to_contain_text("platform admins")
    sync_api.expect(page.locator("#incidents button")).to_have_count(0)
    page.goto(server.base + "/ui/#/object/pools/h100-training")
    sync_api.expect(page.locator("#obj-history tbody tr")).to_have_count(1)
