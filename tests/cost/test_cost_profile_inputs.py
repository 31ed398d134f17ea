"""``gpupool profile`` inputs besides a Scenario: a Slurm ``sacct --parsable2`` export and the
store's recorded history (``--from-store``); and the openb trace (skipped without its data)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpupool.cli.main import app
from gpupool.cost.sacct import SacctError, parse_sacct, parse_tres
from gpupool.manifests.convert import workload_model
from gpupool.service.backends.virtual import VirtualBackend
from gpupool.service.config import EXAMPLES, seed_config
from gpupool.service.controller import Controller
from gpupool.store import Store
from tests.cost.test_cost_profile import ONE_POOL, queues, rows
from tests.test_service_support import wl

ROOT = Path(__file__).resolve().parents[2]
OPENB = ROOT.parent / "shared" / "data" / "openb" / "openb_pod_list_default.csv"
runner = CliRunner()

# A hand-written export: steps (.batch, .extern, .0) repeat their allocation; one job never
# started, one still runs, one holds no GPU; a typed gres; a 2-node job; --parsable's trailing |.
SACCT = """\
JobID|User|Account|Partition|Submit|Start|End|AllocTRES|State
1001|alice|vision|gpu|2026-03-02T08:00:00|2026-03-02T08:30:00|2026-03-02T12:30:00|billing=8,cpu=32,gres/gpu=8,mem=256G,node=1|COMPLETED
1001.batch|||gpu|2026-03-02T08:30:00|2026-03-02T08:30:00|2026-03-02T12:30:00|cpu=32,gres/gpu=8,mem=256G,node=1|COMPLETED
1001.extern|||gpu|2026-03-02T08:30:00|2026-03-02T08:30:00|2026-03-02T12:30:00|billing=8,cpu=32,gres/gpu=8,node=1|COMPLETED
1002|bob|nlp|gpu|2026-03-02T09:00:00|2026-03-02T09:00:00|2026-03-02T21:00:00|cpu=128,gres/gpu:a100=16,mem=1T,node=2|FAILED
1002.0|||gpu|2026-03-02T09:00:00|2026-03-02T09:00:00|2026-03-02T21:00:00|cpu=128,gres/gpu:a100=16,node=2|FAILED
1003|carol|nlp|inference|2026-03-02T10:00:00|2026-03-02T10:00:05|2026-03-03T10:00:05|cpu=4,gres/gpu=1,gres/gpu:l40s=1,mem=32G,node=1|CANCELLED by 1234
1004|dave|vision|gpu|2026-03-02T11:00:00|Unknown|Unknown||PENDING
1005|erin|vision|gpu|2026-03-02T11:30:00|2026-03-02T11:31:00|Unknown|cpu=8,gres/gpu=2,mem=64G,node=1|RUNNING
1006|frank|nlp|cpu|2026-03-02T12:00:00|2026-03-02T12:00:00|2026-03-02T13:00:00|cpu=64,mem=128G,node=1|COMPLETED
1007_3|alice|vision|gpu|2026-03-03T08:00:00|2026-03-03T09:00:00|2026-03-03T10:00:00|cpu=8,gres/gpu=2,mem=64G,node=1|TIMEOUT|
"""


def sacct_file(tmp_path: Path, text: str = SACCT) -> Path:
    p = tmp_path / "sacct.txt"
    p.write_text(text)
    return p


# ---------------------------------------------------------------------- the parser
def test_sacct_rows_become_jobs() -> None:
    tr = parse_sacct(SACCT.splitlines(), "sacct.txt")
    got = {j.name: j for j in tr.jobs}
    assert list(got) == ["slurm-1001", "slurm-1002", "slurm-1003", "slurm-1007_3"]  # by submit time
    a, b, c, d = got.values()
    assert (a.queue, a.gpus, a.replicas, a.submit, a.duration) == ("vision", 8, 1, 0.0, 4 * 3600.0)
    assert (a.cpu_milli, a.memory_mib) == (32_000, 256 * 1024)
    assert (b.queue, b.gpus, b.replicas, b.duration) == ("nlp", 8, 2, 12 * 3600.0)  # 16 GPUs on 2 nodes
    assert str(c.type) == "inference" and c.gpus == 1 and c.submit == 7200.0  # partition names the type
    assert str(a.type) == "training" and d.gpus == 2
    assert tr.skipped == {"never started": 1, "still running": 1, "no GPU": 1}
    obs = {(o[0], o[1], o[2]): (o[3], o[4]) for o in tr.observed}
    assert obs[("vision", "training", "")] in {(1800.0, "COMPLETED"), (3600.0, "TIMEOUT")}
    assert obs[("nlp", "training", "a100")] == (0.0, "FAILED")  # typed gres: its model is reported
    assert obs[("nlp", "inference", "l40s")] == (5.0, "CANCELLED")


def test_queue_by_user_or_partition() -> None:
    by_user = parse_sacct(SACCT.splitlines(), "s", "user")
    assert [j.queue for j in by_user.jobs] == ["alice", "bob", "carol", "alice"]
    by_part = parse_sacct(SACCT.splitlines(), "s", "partition")
    assert {j.queue for j in by_part.jobs} == {"gpu", "inference"}


def test_tres_forms() -> None:
    t = parse_tres("cpu=4,mem=500M,gres/gpu:h100=2,gres/gpu:a100=1,billing=4", "x")
    assert (t.gpus, t.model, t.cpu_milli, t.memory_mib) == (3, "", 4000, 500)  # two models: none named
    assert parse_tres("", "x").gpus == 0


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "2001|u|a|gpu|yesterday|2026-03-02T08:00:00|2026-03-02T09:00:00|gres/gpu=1|COMPLETED",
            "s:2: field Submit: 'yesterday' is not a time",
        ),
        ("2002|u|a|gpu|2026-03-02T08:00:00|2026-03-02T09:00:00", "s:2: 6 fields, the header names 9"),
        (
            "2003|u|a|gpu|2026-03-02T08:00:00|2026-03-02T08:00:00|2026-03-02T09:00:00|gres/gpu=two|COMPLETED",
            "s:2: field AllocTRES: gres/gpu='two' is not a whole number",
        ),
        (
            "2004|u|a|gpu|2026-03-02T08:00:00|2026-03-02T10:00:00|2026-03-02T09:00:00|gres/gpu=1|COMPLETED",
            "s:2: field End: times out of order",
        ),
        (
            "2005|u|a|gpu|2026-03-02T08:00:00|2026-03-02T08:00:00|2026-03-02T09:00:00|cpu=1,mem=lots|COMPLETED",
            "s:2: field AllocTRES: mem='lots' is not a size",
        ),
    ],
)
def test_bad_rows_are_located(line: str, message: str) -> None:
    header = SACCT.splitlines()[0]
    with pytest.raises(SacctError) as exc:
        parse_sacct([header, line], "s")
    assert message in str(exc.value)


def test_a_header_without_the_needed_fields_is_named() -> None:
    with pytest.raises(SacctError, match=r"s:1: header lacks Submit, AllocTRES"):
        parse_sacct(["JobID|User|Start|End|State", "1|u|x|y|z"], "s")
    with pytest.raises(SacctError, match="empty"):
        parse_sacct(["", "  "], "s")


# ---------------------------------------------------------------------- the CLI on a sacct export
def test_profile_of_a_sacct_export_alone(tmp_path: Path) -> None:
    res = runner.invoke(app, ["profile", "--sacct", str(sacct_file(tmp_path)), "-o", "json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["summary"]["jobs"] == 4 and "no design" in rep["summary"]["notes"]
    assert "never started" in rep["summary"]["notes"]
    observed = rows(rep, "observed")
    assert {(r["queue"], r["type"]) for r in observed} == {
        ("vision", "training"),
        ("nlp", "training"),
        ("nlp", "inference"),
    }
    assert {r["type"] for r in rows(rep, "preemption")} == {"training", "inference"}


def test_sacct_trace_on_a_design_suggests_queues_per_account(tmp_path: Path) -> None:
    sc = tmp_path / "one-pool.yaml"
    sc.write_text(ONE_POOL)
    args = ["profile", str(sc), "--sacct", str(sacct_file(tmp_path)), "--fit-share", "0.9"]
    res = runner.invoke(app, [*args, "--out-dir", str(tmp_path), "-o", "json"])
    assert res.exit_code == 0, res.output
    suggested = tmp_path / "suggested.yaml"
    qs = queues(suggested)
    assert {"vision", "nlp"} <= set(qs) and qs["vision"]["parent"] == "org"
    assert runner.invoke(app, ["validate", "-f", str(suggested)]).exit_code == 0


def test_profile_input_errors_exit_2_with_the_cause(tmp_path: Path) -> None:
    none = runner.invoke(app, ["profile"])
    assert none.exit_code == 2 and "give a SCENARIO, --from-store or --sacct" in none.output
    bad = sacct_file(tmp_path, SACCT.replace("2026-03-02T09:00:00|2026-03-02T09:00:00", "soon|later", 1))
    res = runner.invoke(app, ["profile", "--sacct", str(bad)])
    assert res.exit_code == 2 and "sacct.txt:5: field Submit: 'soon' is not a time" in res.output
    missing = runner.invoke(app, ["profile", "--sacct", str(tmp_path / "nope.txt")])
    assert missing.exit_code == 2 and "cannot read" in missing.output
    db = runner.invoke(app, ["profile", "--db", "sqlite:///x.db", "--sacct", str(bad)])
    assert db.exit_code == 2 and "--db: only with --from-store" in db.output


# ---------------------------------------------------------------------- the CLI on the store
class Clock:
    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


def recorded_store(tmp_path: Path) -> str:
    """A store whose history holds finished work of two queues in h100-training."""
    url = f"sqlite:///{tmp_path}/gpupool.db"
    store = Store.open(url)
    clk = Clock()
    try:
        seed_config(store, EXAMPLES / "cluster")
        be = VirtualBackend(tmp_path / "vc.json", time_scale=1.0, clock=clk)
        ctl = Controller(store, be, tick_s=0.05, min_interval_s=0.0, clock=clk)
        ctl.recover()
        specs: list[tuple[str, str, Any, str]] = [
            ("r1", "llm-research", 4, "training"),
            ("r2", "llm-research", 8, "training"),
            ("v1", "vision-team", 2, "fine-tuning"),
            ("v2", "vision-team", 1, "evaluation"),
        ]
        for name, queue, gpus, typ in specs:
            m = wl(name, queue=queue, gpus=gpus, pool="h100-training", type=typ, duration="30m")
            rec, _ = store.submit_workload(m, owner="t")
            ctl.submitted(rec, workload_model(m, ctl.bundle.priority_classes, 0.0))
        for _ in range(4):
            clk.t += 1200.0
            ctl.cycle()
        assert {store.get_workload(n).phase for n, *_ in specs} == {"Succeeded"}
    finally:
        store.close()
    return url


def test_profile_from_store_one_pool(tmp_path: Path) -> None:
    url = recorded_store(tmp_path)
    base = ["profile", "--from-store", "--db", url, "--fit-share", "0.5"]
    several = runner.invoke(app, base)
    assert several.exit_code == 2 and "choose one with --pool" in several.output
    res = runner.invoke(app, [*base, "--pool", "h100-training", "--out-dir", str(tmp_path), "-o", "json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["scope"] == "store" and rep["summary"]["jobs"] == 4
    observed = {(r["queue"], r["type"]): r for r in rows(rep, "observed")}
    assert set(observed) == {
        ("llm-research", "training"),
        ("vision-team", "fine-tuning"),
        ("vision-team", "evaluation"),
    }
    assert observed[("llm-research", "training")]["jobs"] == 2
    assert observed[("llm-research", "training")]["topOutcomes"] == "Succeeded 2"
    suggested = tmp_path / "suggested.yaml"
    docs = list(yaml.safe_load_all(suggested.read_text()))
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "ResourcePool"] == ["h100-training"]
    assert runner.invoke(app, ["validate", "-f", str(suggested)]).exit_code == 0
    wrong = runner.invoke(app, [*base, "--pool", "nope"])
    assert wrong.exit_code == 2 and "--pool: 'nope' is not a pool" in wrong.output


# ---------------------------------------------------------------------- openb (shared data)
OPENB_SCENARIO = """
apiVersion: gpupool.io/v1alpha1
kind: Scenario
metadata: {{name: openb-profile}}
spec:
  seed: 1
  policies: [gpupool]
  cluster:
    documents:
      - {{apiVersion: gpupool.io/v1alpha1, kind: Cluster, metadata: {{name: ob}}, spec: {{nodeGroups: [
          {{name: v, count: 16, gpu: {{model: V100M32, count: 8, memory: 32Gi}}, cpu: 96, memory: 512Gi}}]}}}}
      - {{apiVersion: gpupool.io/v1alpha1, kind: ResourcePool, metadata: {{name: openb}}, spec: {{}}}}
      - {{apiVersion: gpupool.io/v1alpha1, kind: Queue, metadata: {{name: org}},
         spec: {{quotas: [{{pool: openb, guarantee: {{nvidia.com/gpu: 128}}}}]}}}}
      - {{apiVersion: gpupool.io/v1alpha1, kind: Queue, metadata: {{name: default}},
         spec: {{parent: org, quotas: [{{pool: openb, guarantee: {{nvidia.com/gpu: 128}}}}]}}}}
  workload:
    openb: {{pods: {pods}, queue: default, maxJobs: 3000}}
"""


@pytest.mark.skipif(not OPENB.exists(), reason="the openb trace is not in ../shared/data")
def test_openb_profile_validates(tmp_path: Path) -> None:
    sc = tmp_path / "openb.yaml"
    sc.write_text(OPENB_SCENARIO.format(pods=OPENB))
    res = runner.invoke(app, ["profile", str(sc), "--out-dir", str(tmp_path), "-o", "json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["summary"]["jobs"] > 1000
    assert {r["key"] for r in rows(rep, "type")}  # demand per task type
    suggested = tmp_path / "suggested.yaml"
    assert "default" in queues(suggested)
    assert runner.invoke(app, ["validate", "-f", str(suggested)]).exit_code == 0
