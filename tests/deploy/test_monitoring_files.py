"""The shipped monitoring files: Prometheus alert rules and the Grafana dashboard.

Why a structural check next to promtool: promtool is only where Debian's ``prometheus``
package is installed (CI installs it), and it cannot know which metrics gpupool exposes. Here
every metric name an expression uses must be one a live service's ``/metrics`` really exposes
(a test server is scraped), and every label it groups by must be one gpupool exports, so a
renamed metric breaks ``make test`` rather than silently emptying a panel or an alert.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_service_support import running_app, wl

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/gpupool-rules.yaml"
RULES_TEST = ROOT / "deploy/prometheus/gpupool-rules.test.yaml"
DASHBOARD = ROOT / "deploy/grafana/gpupool.json"
DOC = ROOT / "docs/metrics.md"

METRIC = re.compile(r"\bgpupool_[a-zA-Z0-9_]+")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
MATCHER_LABEL = re.compile(r"[{,]\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
#: labels gpupool's families carry, plus those Prometheus adds to every scraped series
KNOWN_LABELS = {"queue", "pool", "type", "reason", "phase", "outcome", "le", "instance", "job"}


@pytest.fixture(scope="module")
def exposed(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every sample name a live service's /metrics exposes (from its TYPE lines, so labelled
    families count before their first sample)."""
    with running_app(tmp_path_factory.mktemp("mon")) as api:
        assert api.req("POST", "/v1/workloads", json=wl("m1", pool="h100-training")).status_code == 201
        api.wait_phase("m1", "Running")
        text = api.req("GET", "/metrics").text
    return exposed_names(text)


def exposed_names(text: str) -> set[str]:
    out: set[str] = set()
    for line in text.splitlines():
        if not line.startswith("# TYPE "):
            continue
        _, _, name, kind = line.split()
        out.add(name)
        if kind == "histogram":
            out |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return out


def problems(expr: str, exposed: set[str], where: str) -> list[str]:
    """Metric names an expression uses that are not exposed, and labels no family has."""
    out = [f"{where}: {n} is not exposed by /metrics" for n in METRIC.findall(expr) if n not in exposed]
    labels = {lb.strip() for grp in GROUPING.findall(expr) for lb in grp.split(",") if lb.strip()}
    labels |= set(MATCHER_LABEL.findall(expr))
    out += [f"{where}: label {lb} is not one gpupool exports" for lb in sorted(labels - KNOWN_LABELS)]
    return out


def rules() -> Iterator[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    for g in doc["groups"]:
        yield from g["rules"]


# ---------------------------------------------------------------------- alert rules
def test_rules_file_shape() -> None:
    doc = yaml.safe_load(RULES.read_text())
    assert set(doc) == {"groups"} and doc["groups"]
    names = [g["name"] for g in doc["groups"]]
    assert len(names) == len(set(names))
    alerts = []
    for g in doc["groups"]:
        assert g["rules"], g["name"]
        for r in g["rules"]:
            assert set(r) <= {"alert", "expr", "for", "labels", "annotations"}, r
            assert isinstance(r["expr"], str) and r["expr"].strip()
            assert re.fullmatch(r"\d+[smhd]", r["for"]), r["alert"]
            assert r["labels"]["severity"] in {"warning", "critical"}
            assert r["annotations"]["summary"] and r["annotations"]["description"]
            alerts.append(r["alert"])
    assert len(alerts) == len(set(alerts))
    # the cases the issue names: waits over target, idle pool with waiting work, failures
    # rising, and the controller not cycling / not leading
    assert {
        "GpupoolQueueWaitAboveTarget",
        "GpupoolPoolIdleWhileWorkWaits",
        "GpupoolFailuresRising",
        "GpupoolControllerNotCycling",
        "GpupoolNoLeader",
    } <= set(alerts)


def test_rule_expressions_use_exposed_metrics(exposed: set[str]) -> None:
    bad = [p for r in rules() for p in problems(r["expr"], exposed, r["alert"])]
    assert not bad, bad


def test_the_check_catches_a_renamed_metric(exposed: set[str]) -> None:
    got = problems('sum by (team) (rate(gpupool_admission_wait_seconds_count{queue="x"}[5m]))', exposed, "x")
    assert got == [
        "x: gpupool_admission_wait_seconds_count is not exposed by /metrics",
        "x: label team is not one gpupool exports",
    ]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not on PATH (Debian: prometheus)")
def test_promtool_checks_and_unit_tests_the_rules() -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None
    for args in (["check", "rules", str(RULES)], ["test", "rules", str(RULES_TEST)]):
        r = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode == 0, r.stdout + r.stderr


# ---------------------------------------------------------------------- Grafana dashboard
def dashboard_exprs(d: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for p in d["panels"]:
        for t in p["targets"]:
            yield p["title"], t["expr"]
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            yield f"variable {v['name']}", v["query"]["query"]


def test_dashboard_parses_and_has_the_panels() -> None:
    d = json.loads(DASHBOARD.read_text())
    assert d["uid"] and d["title"] and isinstance(d["schemaVersion"], int)
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        assert p["type"] in {"timeseries", "bargauge", "stat"} and p["targets"], p["title"]
        assert {"h", "w", "x", "y"} <= set(p["gridPos"])
        assert p["datasource"]["uid"] == "${datasource}"  # the data source variable, not a fixed uid
    text = " | ".join(f"{p['title']} {t['expr']}" for p in d["panels"] for t in p["targets"])
    for needed in (
        "gpupool_queue_gpu_used",
        "gpupool_queue_gpu_guarantee",
        "gpupool_queue_pending_gpus",
        "histogram_quantile(0.5, sum by (type, le) (rate(gpupool_admission_wait_time_seconds_bucket",
        "histogram_quantile(0.9, sum by (type, le) (rate(gpupool_admission_wait_time_seconds_bucket",
        "gpupool_workload_failures_total",
        "gpupool_pool_fragmentation_ratio",
        "gpupool_allocated_cost_total",
    ):
        assert needed in text, needed


def test_dashboard_expressions_use_exposed_metrics(exposed: set[str]) -> None:
    d = json.loads(DASHBOARD.read_text())
    exprs = list(dashboard_exprs(d))
    assert len(exprs) >= 10
    bad = [p for where, e in exprs for p in problems(e.replace("$__range", "1h"), exposed, where)]
    assert not bad, bad


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not on PATH (Debian: prometheus)")
def test_dashboard_expressions_are_valid_promql(tmp_path: Path) -> None:
    """Each panel's query, its Grafana variables filled in, as a recording rule promtool parses."""
    d = json.loads(DASHBOARD.read_text())
    subst = {"$__rate_interval": "5m", "$__range": "1h", "$queue": ".*", "$pool": ".*"}
    recs = []
    for i, (_, e) in enumerate(dashboard_exprs(d)):
        if e.startswith("label_values("):
            continue  # a Grafana function, not PromQL
        for k, v in subst.items():
            e = e.replace(k, v)
        recs.append({"record": f"gpupool:panel_{i}", "expr": e})
    f = tmp_path / "panels.yaml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": recs}]}))
    promtool = shutil.which("promtool")
    assert promtool is not None
    r = subprocess.run(
        [promtool, "check", "rules", str(f)], capture_output=True, text=True, timeout=120, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr


# ---------------------------------------------------------------------- chart and docs
def test_servicemonitor_scrapes_the_metrics_port() -> None:
    sm = (ROOT / "charts/gpupool/templates/servicemonitor.yaml").read_text()
    svc = (ROOT / "charts/gpupool/templates/service.yaml").read_text()
    assert "path: /metrics" in sm
    port = re.search(r"- port: (\w+)", sm)
    assert port is not None and re.search(rf"name: {port.group(1)}\b", svc), (
        "ServiceMonitor port not in Service"
    )


def test_docs_name_every_family_and_both_files(exposed: set[str]) -> None:
    doc = DOC.read_text()
    assert "deploy/grafana/gpupool.json" in doc and "deploy/prometheus/gpupool-rules.yaml" in doc
    # the client library's *_created series (a counter's start time) are not gpupool's figures
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in exposed if not n.endswith("_created")}
    missing = sorted(f for f in families if f.removesuffix("_total") not in doc)
    assert not missing, missing
