"""The pool catalog people read (issue 29): what each pool is for, what it costs, how much of it is
promised and free, who may use it and what needs approval; and a workload's priority class
resolved from its task type kept on the record, so every listing and report shows it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.test_service_support import API, running_app


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
