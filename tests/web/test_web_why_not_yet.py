"""The workload page shows who holds what a waiting workload needs and when it should start
(issue 29), in the real headless browser (fixtures of tests/web/test_web.py)."""

from __future__ import annotations

import httpx

from tests.test_service_support import Server, wait_for, wl
from tests.web.test_web import _signed_in, server, sync_api

__all__ = ["server"]  # the fixture, imported for pytest (the browser's is in tests/conftest.py)


def _submit(server: Server, name: str, queue: str, pods: int, duration: str | None) -> None:
    m = wl(name, queue=queue, gpus=8, duration=duration, pool="h100-training")
    m["spec"]["podGroups"][0]["replicas"] = pods
    h = {"Authorization": f"Bearer {server.token}"}
    r = httpx.post(server.base + "/v1/workloads", json=m, headers=h)
    assert r.status_code == 201, r.text


def test_the_workload_page_shows_the_holders_and_the_estimated_start(server: Server, browser: object) -> None:
    _submit(server, "why-p1", "llm-pretrain", 4, "2h")
    _submit(server, "why-r1", "llm-research", 1, "1h")
    h = {"Authorization": f"Bearer {server.token}"}

    def running() -> bool:
        got = [
            httpx.get(f"{server.base}/v1/workloads/{n}", headers=h).json()["phase"]
            for n in ("why-p1", "why-r1")
        ]
        return got == ["Running", "Running"]

    wait_for(running, 180, "the holders running")
    _submit(server, "why-wait", "llm-research", 2, None)  # 16 more: past the cohort's 64
    page = _signed_in(server, browser, path="/ui/#/workload/why-wait")
    box = page.locator("#wl-holders")
    sync_api.expect(box.locator("tbody tr")).to_have_count(2, timeout=60_000)
    rows = [r.get_attribute("data-name") for r in box.locator("tbody tr").all()]
    assert rows == ["why-p1", "why-r1"]  # largest first
    sync_api.expect(box.locator("tbody tr").first).to_contain_text("32")
    sync_api.expect(page.locator("#wl-usage")).to_have_text(
        "pool h100-training: 40 of 64 GPUs allocated; cohort ai-org: in use 40 of 64"
    )
    sync_api.expect(page.locator("#wl-estimate")).to_contain_text("estimated start ")
    sync_api.expect(page.locator("#wl-estimate")).to_contain_text("after why-r1 ends")
    sync_api.expect(box).to_contain_text("held by running work of cohort ai-org in pool h100-training")
    assert page.locator("#error").is_hidden()
    assert page.outside == [], page.outside
