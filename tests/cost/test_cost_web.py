"""The report page and the weekly HTML in a real headless browser (skipped without chromium)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_service_support import Server, wl

# the browser fixture, and the skip (or failure) without one: tests/conftest.py
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("costweb") / "state", time_scale=3600.0)
    srv.start()
    try:
        with srv.client() as c:
            assert c.post("/v1/workloads", json=wl("web-a", duration="1h")).status_code == 201
            end = time.monotonic() + 20
            while c.get("/v1/workloads/web-a").json()["phase"] != "Succeeded":
                assert time.monotonic() < end, "web-a did not finish"
                time.sleep(0.1)
        yield srv
    finally:
        srv.stop()


def test_report_page_shows_the_chargeback(server: Server, browser: object) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    page.goto(server.base + "/ui/")
    page.fill("#token", server.token)
    page.click("#login button")
    sync_api.expect(page.locator("#who")).to_contain_text("platform-admin")
    page.get_by_role("link", name="Cost reports").click()
    sync_api.expect(page.locator("#report-summary")).to_contain_text("reconciles: yes")
    sync_api.expect(page.locator("section[data-table=teams]")).to_contain_text("llm-research")
    # cost per team as stacked bars under the top team, never a parent beside its children
    sync_api.expect(page.locator("#team-figure")).to_be_visible()
    sync_api.expect(page.locator("#chart-teams .legendtext", has_text="llm-research")).to_have_count(1)
    sync_api.expect(page.locator("#chart-teams .xtick", has_text="llm-team")).to_have_count(0)
    page.fill("#report-form input[name=from]", "2030-01-02")
    page.fill("#report-form input[name=to]", "2030-01-01")
    page.click("#report-form button[type=submit]")
    sync_api.expect(page.locator("#error")).to_contain_text("to: must be after from")


def test_weekly_page_draws_its_charts_offline(server: Server, browser: object, tmp_path: Path) -> None:
    with server.client() as c:
        html = c.get("/v1/reports/weekly", params={"format": "html"}).text
    f = tmp_path / "weekly.html"
    f.write_text(html)
    page = browser.new_page()  # type: ignore[attr-defined]
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f.as_uri())
    sync_api.expect(page.locator(".js-plotly-plot")).to_have_count(8)
    assert errors == []
    assert [u for u in requests if not u.startswith("file:")] == []  # nothing fetched from anywhere
