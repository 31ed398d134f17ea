"""The web dashboard in a real headless browser (Debian's chromium driven by Playwright)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_service_support import Server

# the browser fixture, and the skip (or failure) without one: tests/conftest.py
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("web") / "state", time_scale=1.0)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


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
    # a POST round trip: under CI's parallel load the server may take longer than expect's 5 s
    sync_api.expect(page.locator("#submit-result")).to_contain_text("submitted web-job", timeout=20000)
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
    sync_api.expect(page.locator("#submit-result")).to_contain_text("422", timeout=20000)
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


# ---------------------------------------------------------------------- the dashboard people read


def _signed_in(
    server: Server, browser: object, width: int = 1400, height: int = 900, path: str = "/ui/"
) -> Any:
    page: Any = browser.new_page(viewport={"width": width, "height": height})  # type: ignore[attr-defined]
    outside: list[str] = []
    page.on("request", lambda r: None if r.url.startswith((server.base, "data:")) else outside.append(r.url))
    page.outside = outside
    page.goto(server.base + "/ui/")
    page.fill("#token", server.token)
    page.click("#login button")
    sync_api.expect(page.locator("#who")).to_contain_text("platform-admin")
    if path != "/ui/":
        page.goto(server.base + path)
    return page


def _submit(
    server: Server, *names: str, queue: str = "llm-research", replicas: int = 1, gpus: int = 1
) -> None:
    import httpx

    from tests.test_service_support import wl

    h = {"Authorization": f"Bearer {server.token}"}
    for n in names:
        body = wl(n, queue=queue, gpus=gpus, duration="2h")
        body["spec"]["podGroups"][0]["replicas"] = replicas
        r = httpx.post(server.base + "/v1/workloads", json=body, headers=h)
        assert r.status_code in (200, 201), r.text


def test_queue_tree_shows_guarantee_use_borrowing_and_inherited_limits(
    server: Server, browser: object
) -> None:
    page = _signed_in(server, browser)
    rows = page.locator("#quota tbody tr[data-queue]")
    sync_api.expect(rows.first).to_be_visible()
    order = [r.get_attribute("data-queue") for r in rows.all()]
    assert order.index("ai-org") < order.index("llm-team") < order.index("llm-pretrain")
    pretrain = page.locator("#quota tr[data-queue=llm-pretrain]").first
    cells = [c.inner_text() for c in pretrain.locator("td").all()]
    assert cells[2] == "h100-training" and cells[3] == "32"
    assert cells[6] == "64"  # llm-team's limit (40 + 24 borrowing), not "∞"
    assert [h.inner_text() for h in page.locator("#quota thead th").all()][5] == "borrowing"


def test_workloads_are_searchable_sortable_with_age_and_every_page(server: Server, browser: object) -> None:
    _submit(server, "srch-zeta", "srch-alpha", "srch-mid")
    page = _signed_in(server, browser)
    page.fill("#search", "srch-")
    rows = page.locator("#workloads tbody tr")
    sync_api.expect(rows).to_have_count(3)
    page.click("#workloads button.sort[data-key=name]")
    names = [r.get_attribute("data-name") for r in rows.all()]
    assert names == ["srch-alpha", "srch-mid", "srch-zeta"]
    page.click("#workloads button.sort[data-key=name]")
    assert [r.get_attribute("data-name") for r in rows.all()] == names[::-1]
    age = rows.first.locator("td").nth(4).inner_text()
    assert age.endswith(("s", "m")), age
    sync_api.expect(page.locator("#workload-count")).to_contain_text("3 of")


def test_workload_page_explains_in_words_with_attempts_and_events(server: Server, browser: object) -> None:
    _submit(server, "page-fill", "page-big", gpus=8, replicas=7)  # two of 56 GPUs: the second waits
    page = _signed_in(server, browser)
    page.fill("#search", "page-big")
    page.locator("#workloads tr[data-name=page-big] a").first.click()
    sync_api.expect(page.locator("#workload-page")).to_be_visible()
    sync_api.expect(page.locator("#wl-title")).to_have_text("Workload page-big")
    sync_api.expect(page.locator("#wl-why")).to_contain_text("Pending")
    sync_api.expect(page.locator("#wl-why")).to_contain_text("position")
    sync_api.expect(page.locator("#wl-attempts li").first).to_contain_text("run(s) started")
    sync_api.expect(page.locator("#wl-events tbody tr").first).to_contain_text("Submitted")
    page.locator("#wl-facts a").first.click()  # the queue link leads back to the tree
    sync_api.expect(page.locator("#overview")).to_be_visible()


def test_cancel_asks_first(server: Server, browser: object) -> None:
    _submit(server, "to-cancel")
    page = _signed_in(server, browser)
    page.fill("#search", "to-cancel")
    row = page.locator("#workloads tr[data-name=to-cancel]")
    asked: list[str] = []

    def dismiss(d: Any) -> None:
        asked.append(d.message)
        d.dismiss()

    page.once("dialog", dismiss)
    row.get_by_role("button", name="cancel").click()
    page.wait_for_timeout(500)
    assert asked and "to-cancel" in asked[0]
    sync_api.expect(row.locator("td").nth(3)).not_to_have_text("Cancelled")
    page.once("dialog", lambda d: d.accept())
    row.get_by_role("button", name="cancel").click()
    sync_api.expect(row.locator("td").nth(3)).to_have_text("Cancelled", timeout=10000)


SHOT_STATS = """async (b64) => {
  const img = new Image(); img.src = "data:image/png;base64," + b64; await img.decode();
  const c = document.createElement("canvas"); c.width = img.width; c.height = img.height;
  const g = c.getContext("2d"); g.drawImage(img, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data, seen = new Map();
  let n = 0;
  for (let i = 0; i < d.length; i += 4 * 7, n++) {
    const k = (d[i] << 16) | (d[i + 1] << 8) | d[i + 2];
    seen.set(k, (seen.get(k) || 0) + 1);
  }
  return [seen.size, Math.max(...seen.values()) / n];
}"""


def _png_has_content(page: Any, png: bytes) -> bool:
    """Not an empty page: the screenshot, decoded by the browser, has many colours, none dominant."""
    import base64

    colours, top = page.evaluate(SHOT_STATS, base64.b64encode(png).decode())
    return bool(colours > 30 and top < 0.95)


@pytest.mark.parametrize(("width", "height"), [(1400, 900), (390, 844)])
def test_every_page_renders_with_data(
    server: Server, browser: object, tmp_path: Path, width: int, height: int
) -> None:
    _submit(server, f"shot-{width}")
    page = _signed_in(server, browser, width, height)
    sync_api.expect(page.locator("#pools tbody tr")).to_have_count(3)
    sync_api.expect(page.locator("#quota tbody tr").first).to_be_visible()
    sync_api.expect(page.locator("#workloads tbody tr").first).to_be_visible()
    sync_api.expect(page.locator("#nodes .node")).to_have_count(16)
    sync_api.expect(page.locator("#chart-pools .main-svg").first).to_be_attached(timeout=15000)
    sync_api.expect(page.locator("#chart-pending .main-svg").first).to_be_attached()
    # the page refreshes every 5 s and clears an error line once a refresh succeeds: a request
    # that failed while the server was busy must clear, a lasting error fails (with its text)
    err = page.locator("#error")
    try:
        sync_api.expect(err).to_be_hidden(timeout=15000)
    except AssertionError as exc:
        raise AssertionError(f"the page shows an error: {err.text_content()!r}") from exc
    overview = page.screenshot(path=str(tmp_path / f"overview-{width}.png"), full_page=True)
    assert _png_has_content(page, overview)
    page.goto(server.base + f"/ui/#/workload/shot-{width}")
    sync_api.expect(page.locator("#wl-events tbody tr").first).to_be_visible()
    sync_api.expect(page.locator("#wl-why")).not_to_be_empty()
    assert page.locator("#error").is_hidden() and page.locator("#overview").is_hidden()
    wl_png = page.screenshot(path=str(tmp_path / f"workload-{width}.png"), full_page=True)
    assert _png_has_content(page, wl_png)
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width + 1, f"the page is {scroll}px wide in a {width}px window"
    assert page.outside == [], page.outside


def test_history_series_follow_admissions(server: Server) -> None:
    import httpx

    h = {"Authorization": f"Bearer {server.token}"}
    data = httpx.get(server.base + "/v1/history", params={"hours": 1}, headers=h).json()
    assert len(data["times"]) == 60
    assert set(data["pools"]) <= {"h100-training", "a100-inference", "l40s-experiment"}
    assert data["pools"] and max(max(v) for v in data["pools"].values()) > 0
    assert all(len(v) == 60 for v in (*data["pools"].values(), *data["pending"].values()))
