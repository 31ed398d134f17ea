"""Fault injection: 5xx on any request, 409 on writes only, latency, configuration errors."""

from __future__ import annotations

import time

import httpx
import pytest

from gpupool.kube.fake import FakeApiServer, FaultConfig

CM = "/api/v1/namespaces/default/configmaps"


def test_error_rate_one_fails_every_request_with_a_status(fake_server: FakeApiServer) -> None:
    fake_server.faults = FaultConfig(error_rate=1.0, seed=3)
    with httpx.Client(base_url=fake_server.url) as c:
        codes = {c.get(CM).status_code for _ in range(20)}
        body = c.get("/api/v1/nodes").json()
    assert codes == {500, 503}
    assert body["kind"] == "Status" and body["reason"] in ("InternalError", "ServiceUnavailable")
    assert fake_server.stats.faults_injected == 21


def test_conflict_rate_hits_writes_not_reads(fake_server: FakeApiServer) -> None:
    fake_server.faults = FaultConfig(conflict_rate=1.0)
    with httpx.Client(base_url=fake_server.url) as c:
        assert c.get(CM).status_code == 200
        r = c.post(CM, json={"metadata": {"name": "x"}})
    assert r.status_code == 409 and r.json()["reason"] == "Conflict"
    assert fake_server.list("configmaps", "default") == []


def test_partial_rates_are_seeded_and_repeatable(fake_server: FakeApiServer) -> None:
    def run() -> list[int]:
        fake_server.faults = FaultConfig(error_rate=0.3, seed=7)
        with httpx.Client(base_url=fake_server.url) as c:
            return [c.get(CM).status_code for _ in range(30)]

    first, second = run(), run()
    assert first == second and 200 in first and any(code >= 500 for code in first)


def test_latency_delays_requests(fake_server: FakeApiServer) -> None:
    fake_server.faults = FaultConfig(latency_s=0.2)
    with httpx.Client(base_url=fake_server.url) as c:
        t = time.monotonic()
        c.get(CM)
        assert time.monotonic() - t >= 0.2


def test_faults_off_again(fake_server: FakeApiServer) -> None:
    fake_server.faults = FaultConfig(error_rate=1.0)
    fake_server.faults = FaultConfig()
    with httpx.Client(base_url=fake_server.url) as c:
        assert c.get(CM).status_code == 200


@pytest.mark.parametrize("kw", [{"error_rate": 1.5}, {"conflict_rate": -0.1}, {"latency_s": -1.0}])
def test_bad_fault_config_names_the_field(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kw))):
        FaultConfig(**kw)
