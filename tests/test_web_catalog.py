"""The dashboard's pool catalog page, in the real headless browser (fixtures of tests/test_web.py)."""

from __future__ import annotations

from tests.test_service_support import Server
from tests.test_web import _signed_in, browser, server, sync_api

__all__ = ["browser", "server"]  # the fixtures, imported for pytest


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
