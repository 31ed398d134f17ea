"""The dashboard's pool catalog page, in the real headless browser (fixtures of tests/web/test_web.py)."""

from __future__ import annotations

from tests.test_service_support import Server
from tests.web.test_web import _signed_in, server, sync_api

__all__ = ["server"]  # the fixture, imported for pytest (the browser's is in tests/conftest.py)


def test_the_catalog_page_shows_each_pool_as_a_service(server: Server, browser: object) -> None:
    page = _signed_in(server, browser, path="/ui/#/catalog")
    cards = page.locator(".catalog-entry")
    sync_api.expect(cards).to_have_count(3)
    inference = page.locator('.catalog-entry[data-pool="a100-inference"]')
    sync_api.expect(inference).to_contain_text("platinum")
    sync_api.expect(inference).to_contain_text("never preempted")
    sync_api.expect(inference).to_contain_text("sent here first: inference")
    sync_api.expect(inference.locator("li").first).to_contain_text("serving")
    training = page.locator('.catalog-entry[data-pool="h100-training"]')
    sync_api.expect(training).to_contain_text("64 guaranteed to queues")
    assert page.locator("#error").is_hidden() and page.locator("#overview").is_hidden()
    assert page.outside == [], page.outside


def test_a_phase_never_wraps_mid_word_at_1400_px(server: Server, browser: object) -> None:
    """Before: "Succeeded" broke across two lines in the workloads table at 1400 px."""
    import httpx

    from tests.test_service_support import wait_for, wl

    h = {"Authorization": f"Bearer {server.token}"}
    body = wl("short-one", duration="1s")
    body["metadata"]["annotations"] = {"gpupool.io/description": "a very long reason " * 20}
    assert httpx.post(server.base + "/v1/workloads", json=body, headers=h).status_code in (200, 201)
    wait_for(
        lambda: httpx.get(server.base + "/v1/workloads/short-one", headers=h).json()["phase"] == "Succeeded",
        60,
        "short-one to succeed",
    )
    page = _signed_in(server, browser, 1400, 900)
    cell = page.locator("#workloads tbody td.phase-Succeeded").first
    sync_api.expect(cell).to_be_visible()
    # a table under pressure, as a busy cluster's is: a long name and a long reason in one row
    page.evaluate(
        "() => { const tr = document.querySelector('#workloads tbody tr');"
        " tr.cells[0].textContent = 'llama-405b-pretrain-' + 'x'.repeat(60);"
        " tr.cells[5].textContent = 'queue llm-research: pool h100-training GPU guarantee 8 '.repeat(12); }"
    )
    lines = cell.evaluate(
        "td => { const r = document.createRange(); r.selectNodeContents(td);"
        " return new Set([...r.getClientRects()].map((b) => Math.round(b.top))).size; }"
    )
    assert lines == 1, f"the phase takes {lines} lines"
