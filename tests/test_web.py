"""The web dashboard in a real headless browser (Debian's chromium driven by Playwright)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_service_support import Server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
if CHROMIUM is None and os.environ.get("GPUPOOL_REQUIRE_BROWSER") == "1":
    raise RuntimeError("GPUPOOL_REQUIRE_BROWSER=1 but no chromium is installed")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (CI installs Debian's)")

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("web") / "state", time_scale=1.0)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield b
        finally:
            b.close()


def test_dashboard_signs_in_shows_pools_and_submits(server: Server, browser: object, tmp_path: Path) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    page.goto(server.base + "/")
    # without a token the page says how to get one
    sync_api.expect(page.locator("#error")).to_contain_text("Sign in with an API token")
    page.fill("#token", server.token)
    page.click("#login button")
    sync_api.expect(page.locator("#who")).to_contain_text("platform-admin")
    sync_api.expect(page.locator("#pools tbody tr")).to_have_count(3)
    sync_api.expect(page.locator("#pools tbody")).to_contain_text("h100-training")
    sync_api.expect(page.locator("#quota tbody")).to_contain_text("llm-research")
    sync_api.expect(page.locator("#nodes .node")).to_have_count(16)

    page.fill("#submit input[name=name]", "web-job")
    page.select_option("#submit select[name=queue]", "llm-research")
    page.fill("#submit input[name=gpus]", "2")
    page.click("#submit button")
    sync_api.expect(page.locator("#submit-result")).to_contain_text("submitted web-job")
    row = page.locator("#workloads tr[data-name=web-job]")
    sync_api.expect(row).to_contain_text("llm-research")
    sync_api.expect(row.locator("td").nth(3)).to_have_text("Running", timeout=15000)
    row.get_by_role("button", name="explain").click()
    sync_api.expect(page.locator("#explain")).to_contain_text("web-job")
    page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)


def test_bad_submission_shows_the_field_and_keeps_the_page(server: Server, browser: object) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    page.goto(server.base + "/ui/")
    page.fill("#token", server.token)
    page.click("#login button")
    sync_api.expect(page.locator("#who")).to_contain_text("platform-admin")
    page.fill("#submit input[name=name]", "too-big")
    page.fill("#submit input[name=gpus]", "1.5")
    page.click("#submit button")
    sync_api.expect(page.locator("#submit-result")).to_contain_text("422")
    sync_api.expect(page.locator("#submit-result")).to_contain_text("nvidia.com/gpu")
    sync_api.expect(page.locator("#pools tbody tr")).to_have_count(3)


def test_wrong_token_is_explained(server: Server, browser: object) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    page.goto(server.base + "/ui/")
    page.fill("#token", "gpt_not-a-token")
    page.click("#login button")
    sync_api.expect(page.locator("#error")).to_contain_text("401")


def test_explain_shows_attempts_and_failure_history(server: Server, browser: object) -> None:
    import httpx

    from tests.test_service_support import wait_for, wl

    body = wl("web-flaky", duration="1h", maxRetries=1)
    body["metadata"]["annotations"] = {"gpupool.io/fail-after": "1s", "gpupool.io/exit-code": "137"}
    h = {"Authorization": f"Bearer {server.token}"}
    assert httpx.post(server.base + "/v1/workloads", json=body, headers=h).status_code == 201
    wait_for(
        lambda: httpx.get(server.base + "/v1/workloads/web-flaky", headers=h).json()["failures"],
        timeout=30,
        what="a recorded failure",
    )
    page = browser.new_page()  # type: ignore[attr-defined]
    page.goto(server.base + "/")
    page.fill("#token", server.token)
    page.click("#login button")
    row = page.locator("#workloads tr[data-name=web-flaky]")
    row.get_by_role("button", name="explain").click()
    sync_api.expect(page.locator("#explain")).to_contain_text("attempts:")
    sync_api.expect(page.locator("#explain")).to_contain_text("exit code 137")
