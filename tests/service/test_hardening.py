"""One bad submission never stops others: bounded quantities, unstorable text, isolation of
workloads the scheduling cycle fails on (issue 9, critical holes 1 and 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpupool import quantity as qty
from gpupool.engine import Engine
from gpupool.manifests import ManifestError, parse_documents
from gpupool.model import PodGroup, PodRequest, Workload
from gpupool.service.failures.culprits import find_culprits
from tests.test_service_support import Api, db_url, running_app, wait_for, wl

__all__ = ["db_url"]

EXTREME = [
    {"nvidia.com/gpu": 1, "cpu": 10**30},
    {"nvidia.com/gpu": 1, "cpu": 1e308},
    {"nvidia.com/gpu": 1, "memory": "1e300Gi"},
    {"nvidia.com/gpu": "1e400"},
    {"nvidia.com/gpu": 10**20},
    {"nvidia.com/gpumem": 10**30, "nvidia.com/gpu": 0.5},
    {"rdma": 10**30, "nvidia.com/gpu": 1},
    {"nvidia.com/gpu": 1, "cpu": "9" * 5000},
    {"nvidia.com/gpu": 1, "memory": "1e999999999"},
]


@pytest.fixture
def api(tmp_path: Path, db_url: str) -> Api:
    with running_app(tmp_path, db_url) as a:
        yield a


def _with(name: str, resources: dict[str, Any], **spec: Any) -> dict[str, Any]:
    body = wl(name, **spec)
    body["spec"]["podGroups"] = [{"replicas": 1, "resources": resources}]
    return body


def _ready(api: Api) -> bool:
    return api.req("GET", "/readyz").status_code == 200


def test_extreme_quantities_are_refused_naming_the_field_and_scheduling_goes_on(api: Api) -> None:
    for i, res in enumerate(EXTREME):
        r = api.req("POST", "/v1/workloads", json=_with(f"x-{i}", res))
        assert r.status_code == 422, (res, r.text)
        fields = [e["field"] for e in r.json()["error"]["errors"]]
        assert any(f.startswith("spec.podGroups[0].resources") for f in fields), (res, fields)
    assert api.req("POST", "/v1/workloads", json=wl("good", duration="1h")).status_code == 201
    api.wait_phase("good", "Running")
    assert _ready(api)


def test_a_request_no_node_can_hold_is_refused_with_the_largest_offer(api: Api) -> None:
    r = api.req("POST", "/v1/workloads", json=_with("huge-cpu", {"nvidia.com/gpu": 1, "cpu": 100_000}))
    assert r.status_code == 422, r.text
    err = r.json()["error"]["errors"][0]
    assert err["field"] == "spec.podGroups[0].resources"
    assert "fits no node" in err["problem"] and "largest node offers" in err["problem"]
    r = api.req("POST", "/v1/workloads", json=_with("many-gpus", {"nvidia.com/gpu": 9}))
    assert r.status_code == 422 and "fits no node" in r.text


def test_nul_and_surrogates_are_refused_at_validation_and_the_server_restarts(
    tmp_path: Path, db_url: str
) -> None:
    with running_app(tmp_path, db_url) as api:
        bad = wl("nul-1", exception={"reason": "deadline\u0000", "duration": "1h"})
        r = api.req("POST", "/v1/workloads", json=bad)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["errors"][0]["field"] == "spec.exception.reason"
        assert "NUL" in r.text
        r = api.req(
            "POST",
            "/v1/workloads",
            content=b'{"apiVersion":"gpupool.io/v1alpha1","kind":"Workload",'
            b'"metadata":{"name":"s-1","labels":{"a":"\\ud800"}},"spec":{}}',
        )
        assert r.status_code == 422 and "surrogate" in r.text, r.text
        assert api.req("GET", "/v1/workloads/nul-1").status_code == 404  # nothing was committed
        assert api.req("POST", "/v1/workloads", json=wl("after", duration="1h")).status_code == 201
    with running_app(tmp_path, db_url) as api:  # a restart recovers
        assert _ready(api)
        api.wait_phase("after", "Running", "Succeeded", timeout=30)


def test_files_and_api_share_one_validator() -> None:
    text = "apiVersion: gpupool.io/v1alpha1\nkind: Workload\nmetadata: {name: bad_name}\nspec: {podGroups: [{}]}\n"
    with pytest.raises(ManifestError, match=r"metadata\.name"):
        parse_documents(text)
    with pytest.raises(ManifestError, match=r"metadata: must be a mapping"):
        parse_documents("apiVersion: gpupool.io/v1alpha1\nkind: Workload\nmetadata: abc\nspec: {}\n")
    with pytest.raises(ManifestError, match="NUL"):
        parse_documents('apiVersion: gpupool.io/v1alpha1\nkind: Workload\nmetadata: {name: "a\\0"}\n')
    # both the metadata and the spec problems are reported in one round
    with pytest.raises(ManifestError) as e:
        parse_documents(
            "apiVersion: gpupool.io/v1alpha1\nkind: Workload\nmetadata: {name: A}\nspec: {x: 1}\n"
        )
    assert {"metadata.name", "spec.x"} <= {line.split(": ")[2] for line in e.value.errors}


def test_quantities_and_durations_are_bounded() -> None:
    for v in ("1e400", 10**30, 1e308, "9" * 100, "1e999999999", "1e300Gi"):
        with pytest.raises(qty.QuantityError):
            qty.cpu_milli(v)
    assert qty.cpu_milli("224") == 224_000
    for d in ("99999999999d", 1e20, "1" * 200 + "s"):
        with pytest.raises(qty.QuantityError):
            qty.parse_duration(d)
    assert qty.parse_duration("36500d") == 36500 * 86400


def test_huge_durations_in_a_manifest_are_a_located_error(api: Api) -> None:
    r = api.req("POST", "/v1/workloads", json=wl("long", duration="99999999999d"))
    assert r.status_code == 422 and r.json()["error"]["errors"][0]["field"] == "spec.duration", r.text
    r = api.req(
        "POST", "/v1/workloads", json=wl("exc", exception={"reason": "x", "duration": "99999999999d"})
    )
    assert r.status_code == 422 and "spec.exception.duration" in r.text, r.text


# ---------------------------------------------------------------------- isolation
def _w(name: str) -> Workload:
    return Workload(name, "q", (PodGroup("main", 1, PodRequest(gpus=1)),))


def test_find_culprits_names_exactly_the_failing_workloads() -> None:
    ws = [_w(f"w{i}") for i in range(40)]
    poison = {"w3", "w31"}

    def run(batch: list[Workload]) -> None:
        hit = poison & {w.name for w in batch}
        if hit:
            raise OverflowError(f"boom on {sorted(hit)[0]}")

    resets: list[int] = []
    bad = find_culprits(ws, run, lambda: resets.append(1))
    assert set(bad) == poison and bad["w3"].startswith("OverflowError")
    assert resets, "state is rebuilt after every failed trial"


def test_find_culprits_for_a_failure_that_needs_two_workloads_and_one_that_needs_none() -> None:
    ws = [_w(f"w{i}") for i in range(16)]

    def together(batch: list[Workload]) -> None:
        if {"w2", "w12"} <= {w.name for w in batch}:
            raise ValueError("only together")

    assert set(find_culprits(ws, together, lambda: None)) == {"w12"}

    def always(batch: list[Workload]) -> None:
        raise RuntimeError("the store is down")

    assert find_culprits(ws, always, lambda: None) == {}


def test_a_workload_the_cycle_fails_on_is_isolated_and_the_rest_run(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Engine.cycle

    def cycle(self: Engine, pending: Any, *a: Any, **k: Any) -> Any:
        pending = list(pending)
        if any(w.name == "poison" for w in pending):
            raise OverflowError("Python int too large to convert to C long")
        return real(self, pending, *a, **k)

    monkeypatch.setattr(Engine, "cycle", cycle)
    assert api.req("POST", "/v1/workloads", json=wl("poison", duration="1h")).status_code == 201
    for i in range(3):
        assert api.req("POST", "/v1/workloads", json=wl(f"ok-{i}", duration="1h")).status_code == 201
    for i in range(3):
        api.wait_phase(f"ok-{i}", "Running", "Succeeded")
    wait_for(lambda: "scheduler failed on this workload" in api.get("/v1/workloads/poison")["reason"])
    assert api.phase("poison") == "Pending"
    ex = api.get("/v1/workloads/poison/explain")
    assert ex["code"] == "Invalid" and "OverflowError" in ex["reason"]
    actions = [(r["action"], r["name"]) for r in api.get("/v1/audit", params={"limit": 1000})["items"]]
    assert ("workload.isolate", "poison") in actions
    assert _ready(api)
    # later submissions keep running while the bad one is held out
    assert api.req("POST", "/v1/workloads", json=wl("ok-late", duration="1h")).status_code == 201
    api.wait_phase("ok-late", "Running", "Succeeded")


# ---------------------------------------------------------------------- recovery never dies on a row
def test_recovery_survives_bad_rows(tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stored object a stricter validator now refuses, an unreadable placement and an
    approval request that cannot be stored: recovery reports each and the server starts."""
    import sqlalchemy as sa

    from gpupool.service.backends.virtual import VirtualBackend
    from gpupool.service.config import EXAMPLES, seed_config
    from gpupool.service.controller import Controller
    from gpupool.store import PhaseChange, Store
    from gpupool.store.schema import ObjectRow, WorkloadRow

    store = Store.open(db_url)
    seed_config(store, EXAMPLES / "cluster")
    ctl = Controller(store, VirtualBackend(tmp_path / "vc.json", time_scale=1.0), tick_s=0.05)
    ctl.recover()
    store.submit_workload(wl("placed"), owner="t")
    store.apply_transitions(
        [PhaseChange("placed", "Admitted", "test", {"pool": "h100-training", "pods": [{"x": 1}]})]
    )
    store.submit_workload(wl("waits"), owner="t", phase="AwaitingApproval")
    store.submit_workload(wl("fine", duration="1h"), owner="t")
    with store.engine.begin() as c:  # a queue stored before the weight bound existed
        row = c.execute(sa.select(ObjectRow.spec).where(ObjectRow.name == "vision-team")).scalar_one()
        c.execute(
            sa.update(ObjectRow).where(ObjectRow.name == "vision-team").values(spec={**row, "weight": 1e9})
        )
        assert c.execute(sa.select(sa.func.count()).select_from(WorkloadRow)).scalar_one() == 3

    def refuse(*a: Any, **k: Any) -> None:
        raise ValueError("A string literal cannot contain NUL (0x00) characters.")

    monkeypatch.setattr(store, "request_approval", refuse)
    ctl2 = Controller(store, VirtualBackend(tmp_path / "vc.json", time_scale=1.0), tick_s=0.05)
    ctl2.recover()
    assert ctl2.ready
    placed = store.get_workload("placed")  # the backend cannot start it: it fails alone, with the reason
    assert placed.phase == "Failed" and "KeyError" in placed.reason, placed
    assert store.get_workload("waits").phase == "Rejected"
    assert "vision-team" not in ctl2.parents and "llm-research" in ctl2.parents
    ctl2.cycle()
    assert store.get_workload("fine").phase == "Running"
    store.close()


def test_validate_reports_every_problem_in_one_round_and_brackets_survive(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpupool.cli.main import app

    f = tmp_path / "bad.yaml"
    f.write_text(
        "apiVersion: gpupool.io/v1alpha1\nkind: Workload\nmetadata: {name: huge}\n"
        "spec: {queue: q, podGroups: [{resources: {nvidia.com/gpu: '1e400', cpu: 1e308}}]}\n---\n"
        "apiVersion: gpupool.io/v1alpha1\nkind: Workload\nmetadata: {name: under_score}\n"
        "spec: {queue: q, podGroups: [{}]}\n"
    )
    r = CliRunner().invoke(app, ["validate", "-f", str(f)])
    assert r.exit_code == 2
    out = " ".join(r.output.split())
    assert "3 problem(s)" in out and "'1e400' is too large" in out and "'1e308' is too large" in out, out
    assert "'under_score' is not a valid name" in out and "Value error" not in out
    assert "spec.podGroups[0].resources.cpu" in out  # brackets in data are not styling
