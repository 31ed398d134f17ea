"""Fixtures more than one test module needs, written once.

``browser``: Debian's chromium driven by Playwright, for the web dashboard's tests. Why one
fixture: it was written in four modules with different flags, and only one of them honoured
``GPUPOOL_REQUIRE_BROWSER``. A test that asks for ``browser`` is skipped, with the reason, when
Playwright or chromium is missing, and fails instead where ``GPUPOOL_REQUIRE_BROWSER=1`` (CI
installs both: there a missing browser must not pass quietly). The check runs before any of
the test's fixtures are set up, so a missing browser does not start a server first.

PostgreSQL's skip-or-fail (``GPUPOOL_REQUIRE_PG``) lives in tests/pg.py, which the store and
service tests import.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REQUIRE_BROWSER = "GPUPOOL_REQUIRE_BROWSER"
#: headless, and nothing that reaches outside the test's own server
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


def browser_missing() -> str | None:
    """Why no browser can be driven here, or None when Playwright and chromium are both present."""
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed"
    if CHROMIUM is None:
        return "no chromium on this machine (CI installs Debian's)"
    return None


def pytest_configure(config: pytest.Config) -> None:
    """Where a browser is required, a missing one stops the run at once: the browser modules
    import Playwright with ``pytest.importorskip``, which would otherwise skip them quietly."""
    missing = browser_missing()
    if os.environ.get(REQUIRE_BROWSER) == "1" and missing is not None:
        raise pytest.UsageError(f"{REQUIRE_BROWSER}=1 but {missing}")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip (or, where required, fail) a browser test before its fixtures start a server."""
    if "browser" not in getattr(item, "fixturenames", ()):
        return
    missing = browser_missing()
    if missing is None:
        return
    if os.environ.get(REQUIRE_BROWSER) == "1":
        pytest.fail(f"{REQUIRE_BROWSER}=1 but {missing}")
    pytest.skip(missing)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless chromium, one per test module (each module's pages share it)."""
    sync_api = importlib.import_module("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield b
        finally:
            b.close()
