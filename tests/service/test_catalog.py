"""The pool catalog people read (issue 29): what each pool is for, what it costs, how much of it is
promised and free, who may use it and what needs approval; and a workload's priority class
resolved from its task type kept on the record, so every listing and report shows it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpupool.cli import app
from tests.test_service_support import API, running_app

runner = CliRunner()


def _typed(name: str, type_: str, gpus: int = 1) -> dict[str, Any]:
    """A workload that names only its task type: no priority class, no pool."""
    spec = {
        "queue": "llm-research",
        "type": type_,
        "podGroups": [{"resources": {"nvidia.com/gpu": gpus, "cpu": 2, "memory": "8Gi"}}],
    }
    return {"apiVersion": API, "kind": "Workload", "metadata": {"name": name}, "spec": spec}


def test_the_class_a_task_type_gives_is_stored_and_listed(tmp_path: Path) -> None:
    """Before: ``priorityClass: None`` on a workload whose class came from its type."""
    with running_app(tmp_path) as api:
        r = api.req("POST", "/v1/workloads", json=_typed("ev", "evaluation"))
        assert r.status_code in (200, 201, 202), r.text
        assert api.get("/v1/workloads/ev")["priorityClass"] == "evaluation"
        listed = {w["name"]: w for w in api.get("/v1/workloads")["items"]}
        assert listed["ev"]["priorityClass"] == "evaluation"


def test_a_class_the_workload_names_is_kept_as_written(tmp_path: Path) -> None:
    with running_app(tmp_path) as api:
        m = _typed("mine", "evaluation")
        m["spec"]["priorityClass"] = "experiment"
        assert api.req("POST", "/v1/workloads", json=m).status_code in (200, 201, 202)
        assert api.get("/v1/workloads/mine")["priorityClass"] == "experiment"


def test_the_catalog_shows_purpose_price_promised_free_users_and_approvals(tmp_path: Path) -> None:
    """The example cluster: 64 H100s guaranteed to ai-org in h100-training, the inference
    types sent to a100-inference by its environment, the leaf queues that may use each pool."""
    with running_app(tmp_path) as api:
        api.req("POST", "/v1/workloads", json=_typed("one", "training", gpus=8))
        api.wait_phase("one", "Admitted", "Running", timeout=30)
        by = {e["name"]: e for e in api.get("/v1/catalog")["items"]}
        h = by["h100-training"]
        assert (h["environment"], h["slaTier"], h["pricePerGPUHour"]) == ("training", "gold", 2.9)
        assert h["gpuGuaranteed"] == 64 and h["gpuAllocated"] == 8
        assert h["gpuFree"] == h["gpus"] - 8 and h["gpuUnpromised"] == h["gpus"] - 64
        guarantees = {q["queue"]: q["gpuGuarantee"] for q in h["queues"]}
        # serving has no guarantee there but may borrow from its cohort: listed with 0
        assert guarantees == {"llm-pretrain": 32, "llm-research": 8, "vision-team": 24, "serving": 0}
        assert "training" in h["preferredByTaskTypes"] and "fine-tuning" in h["preferredByTaskTypes"]
        assert by["a100-inference"]["preferredByTaskTypes"] == ["inference"]
        inf = {q["queue"]: q["gpuGuarantee"] for q in by["a100-inference"]["queues"]}
        assert inf["serving"] == 32 and {g for q, g in inf.items() if q != "serving"} == {0}
        assert any("exception" in r for r in h["approvalRules"])
        assert api.get("/v1/catalog/a100-inference")["slaTier"] == "platinum"
        missing = api.req("GET", "/v1/catalog/nope")
        assert missing.status_code == 404 and missing.json()["error"]["errors"][0]["field"] == "name"


def test_a_team_member_sees_only_its_own_queues_in_the_catalog(tmp_path: Path) -> None:
    with running_app(tmp_path) as api:
        tok = api.token_for("bob", "member", "vision-team")
        items = api.req("GET", "/v1/catalog", token=tok).json()["items"]
        seen = {q["queue"] for e in items for q in e["queues"]}
        assert seen == {"vision-team"}
        assert {e["name"] for e in items} == {"h100-training", "a100-inference", "l40s-experiment"}


def test_get_pools_wide_and_describe_pool_print_the_catalog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_app(tmp_path) as api:

        class Through:
            def __init__(self, server: str | None, token: str | None) -> None:
                pass

            def call(self, method: str, path: str, **kw: Any) -> Any:
                r = api.req(method, path, **kw)
                assert r.status_code == 200, r.text
                return r.json()

        monkeypatch.setattr("gpupool.cli.client.objects.Api", Through)
        monkeypatch.setattr("gpupool.cli.client.listing.Api", Through, raising=False)
        res = runner.invoke(app, ["get", "pools", "-o", "wide"])
        assert res.exit_code == 0, res.output
        head, *rows = res.stdout.strip().splitlines()
        for col in ("ENV", "TIER", "GUARANTEED", "FREE", "QUEUES"):
            assert col in head, head
        line = next(r for r in rows if r.startswith("a100-inference"))
        assert "platinum" in line and "inference" in line and "serving" in line
        res = runner.invoke(app, ["describe", "pool", "h100-training"])
        assert res.exit_code == 0, res.output
        assert "64 guaranteed to queues" in res.stdout and "needs approval:" in res.stdout
        assert "llm-pretrain" in res.stdout


def test_an_unhealthy_gpu_shows_in_get_nodes_and_describe_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: ``get nodes`` had no health column and ``-o wide`` printed the raw JSON; one bad
    GPU on a node that is up read as healthy to the eye."""
    with running_app(tmp_path) as api:
        node = api.get("/v1/nodes")["items"][0]["name"]
        r = api.req("POST", f"/v1/nodes/{node}/devices/3/health", json={"healthy": False, "reason": "XID 79"})
        assert r.status_code == 200, r.text

        class Through:
            def __init__(self, server: str | None, token: str | None) -> None:
                pass

            def call(self, method: str, path: str, **kw: Any) -> Any:
                got = api.req(method, path, **kw)
                assert got.status_code == 200, got.text
                return got.json()

        monkeypatch.setattr("gpupool.cli.client.objects.Api", Through)
        for wide in ([], ["-o", "wide"]):
            res = runner.invoke(app, ["get", "nodes", *wide])
            assert res.exit_code == 0, res.output
            head, *rows = res.stdout.strip().splitlines()
            assert "HEALTH" in head
            mine = next(line for line in rows if line.split()[0] == node)
            assert "GPU 3 unhealthy" in mine, mine
            assert all("ok" in line.split() for line in rows if line.split()[0] != node)
        res = runner.invoke(app, ["describe", "node", node])
        assert res.exit_code == 0, res.output
        assert "unhealthy: XID 79" in res.stdout


def test_allowed_task_types_are_read_checked_and_shown() -> None:
    from gpupool.manifests import Bundle, ManifestError, build, default_priority_classes, parse_documents
    from gpupool.service.catalog import CatalogEntry, entry_json
    from gpupool.service.readmodel import PoolUsage

    def pool(types: str) -> Bundle:
        text = (
            "{apiVersion: gpupool.io/v1alpha1, kind: ResourcePool, metadata: {name: inf}, "
            f"spec: {{allowedTaskTypes: {types}}}}}\n"
        )
        return build(
            parse_documents(text, "p.yaml"), Bundle(priority_classes=list(default_priority_classes()))
        )

    (p,) = pool("[inference]").pools
    assert p.allowed_types == ("inference",) and p.takes_type("inference") and not p.takes_type("training")
    entry = CatalogEntry(p, PoolUsage(p, 8000, 0, 1), 0, (), (), ())
    assert entry_json(entry)["allowedTaskTypes"] == ["inference"]
    with pytest.raises(ManifestError) as exc:
        pool("[notebooks]")
    assert "spec.allowedTaskTypes" in str(exc.value)
