"""What-ifs on the recorded history: more nodes of a model shorten the replayed waits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.cli.main import app
from gpupool.cost.plan import parse_add
from gpupool.service.config import EXAMPLES, seed_config
from gpupool.store import Store
from tests.cost.test_cost_metering import example_bundle
from tests.test_service_support import wl

runner = CliRunner()


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A store whose history is a burst: 12 jobs of 4 x 8 H100s, an hour each, at once, from two
    teams (one team alone would be held by its borrowing limit, whatever the nodes)."""
    url = f"sqlite:///{tmp_path}/plan.db"
    with Store.open(url) as s:
        seed_config(s, EXAMPLES / "cluster")
        for i in range(12):
            queue = "llm-pretrain" if i % 2 else "vision-team"
            m = wl(f"burst-{i}", queue=queue, gpus=8, duration="1h", priorityClass="training")
            m["spec"]["podGroups"][0]["replicas"] = 4
            s.submit_workload(m, owner="t")
    return url


def test_more_h100_nodes_shorten_the_replayed_waits(db: str) -> None:
    res = runner.invoke(app, ["plan", "--add", "4xH100-80GB", "--db", db, "-o", "json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    t = rep["tables"][0]
    rows = {r[0]: dict(zip(t["columns"], r, strict=True)) for r in t["rows"]}
    assert rep["summary"]["workloads"] == 12
    assert rows["planned"]["gpus"] == rows["today"]["gpus"] + 32
    # 64 H100s run two 32-GPU jobs at a time: waits 0,0,1,1,..,5,5 h, mean 2.5 h; 96 run three: 1.5 h
    assert rows["today"]["wait_mean_s"] == pytest.approx(9000, abs=1)
    assert rows["planned"]["wait_mean_s"] == pytest.approx(5400, abs=1)
    assert rows["today"]["completion_rate"] == rows["planned"]["completion_rate"] == 1.0


def test_bad_additions_are_named(db: str) -> None:
    nodes = example_bundle().nodes
    assert len(parse_add(["2xH100-80GB"], nodes)) == 2
    with pytest.raises(ValueError, match="expected COUNTxGPU-MODEL"):
        parse_add(["H100"], nodes)
    with pytest.raises(ValueError, match="no node with GPU model 'B200'"):
        parse_add(["1xB200"], nodes)
    bad = runner.invoke(app, ["plan", "--add", "1xB200", "--db", db])
    assert bad.exit_code == 2 and "B200" in bad.output
