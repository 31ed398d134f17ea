"""The workload page's logs panel in a real headless browser (as tests/web/test_web.py, whose server
and browser fixtures it reuses): a workload on the virtual cluster that failed and ran
again shows its latest attempt's line, the attempt selector shows the first one's, and the
choice survives the page's periodic reload."""

from __future__ import annotations

import httpx

from tests.test_service_support import Server, wait_for, wl
from tests.web.test_web import _signed_in, server, sync_api

__all__ = ["server"]  # the fixture, imported for pytest (the browser's is in tests/conftest.py)


def test_logs_panel_shows_each_attempt(server: Server, browser: object) -> None:
    body = wl("web-logs", duration="1h", maxRetries=1)
    body["metadata"]["annotations"] = {"gpupool.io/fail-after": "1s", "gpupool.io/retry-backoff": "0.2s"}
    h = {"Authorization": f"Bearer {server.token}"}
    assert httpx.post(server.base + "/v1/workloads", json=body, headers=h).status_code == 201

    def second_run() -> bool:
        return bool(httpx.get(server.base + "/v1/workloads/web-logs", headers=h).json()["attempts"] == 2)

    wait_for(second_run, timeout=30, what="the second attempt")
    page = _signed_in(server, browser, path="/ui/#/workload/web-logs")
    log = page.locator("#wl-log")
    sync_api.expect(log).to_contain_text("web-logs attempt 2:", timeout=15000)
    attempt = page.locator("#wl-log-attempt")
    sync_api.expect(attempt.locator("option")).to_have_text(["1", "2 (latest)"])
    sync_api.expect(page.locator("#wl-log-pod option")).to_have_text(["pod 0"])
    attempt.select_option("1")
    sync_api.expect(log).to_contain_text("web-logs attempt 1: ran on the virtual cluster")
    page.evaluate("refresh()")  # what the 5 s timer does
    sync_api.expect(page.locator("#wl-title")).to_have_text("Workload web-logs")
    sync_api.expect(attempt).to_have_value("1")
    sync_api.expect(log).to_contain_text("web-logs attempt 1:")
    assert page.outside == []
