"""The install's defaults survive a failover: one replica on a claim, or replicas on a shared store.

Why: the chart and the manifests once defaulted to two replicas, each with its own SQLite file on
an emptyDir, so the standby that took over started from an empty store. Now the defaults are one
replica whose store is on a PersistentVolumeClaim (Recreate, no PDB that blocks a drain), 2+
replicas need a shared PostgreSQL (yours or the bundled one), and the unsafe combination is
refused by the chart at render time and by ``gpupool serve --replicas`` at start. The plain
manifests are rendered in Python (always tested); the chart with helm where it is installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpupool.deploy.database import bundled_objects
from gpupool.deploy.manifests import chart_objects
from gpupool.deploy.objects import BUNDLED_AND_URL, REPLICAS_NEED_A_SHARED_DATABASE
from gpupool.deploy.validate import builtin_problems
from gpupool.deploy.values import NAMESPACE, RELEASE, default_values
from gpupool.service.config import ServiceConfig, ServiceConfigError, shared_store_problem

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpupool"
K8S_VERSION = "1.31.0"
PG_URL = "postgresql+psycopg://gpupool:pw@postgres:5432/gpupool"


def _objs(v: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in chart_objects(v, NAMESPACE)}


def _values(**changes: Any) -> dict[str, Any]:
    """The defaults with dotted keys changed: _values(**{"database.url": URL})."""
    v = default_values()
    for key, value in changes.items():
        *path, last = key.split(".")
        d = v
        for p in path:
            d = d[p]
        d[last] = value
    return v


def _scheduler(dep: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "scheduler")


def _state_volume(dep: dict[str, Any]) -> dict[str, Any]:
    return next(vol for vol in dep["spec"]["template"]["spec"]["volumes"] if vol["name"] == "state")


def _db_env(dep: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in _scheduler(dep)["env"] if e["name"] == "GPUPOOL_DATABASE_URL"]


# -- the plain manifests (gpupool.deploy, no helm) -------------------------------------------------
def test_the_defaults_are_one_replica_whose_store_is_on_a_claim() -> None:
    objs = _objs(default_values())
    dep = objs[("Deployment", RELEASE)]
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}  # RWO: no second pod during an update
    assert _state_volume(dep) == {"name": "state", "persistentVolumeClaim": {"claimName": f"{RELEASE}-state"}}
    claim = objs[("PersistentVolumeClaim", f"{RELEASE}-state")]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"] == {"requests": {"storage": "1Gi"}}
    assert "storageClassName" not in claim["spec"]  # '' would turn dynamic provisioning off
    assert claim["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert builtin_problems(claim, K8S_VERSION) == []
    # one replica: no PDB (minAvailable 1 over one pod blocks every drain of its node)
    assert not [k for k in objs if k[0] == "PodDisruptionBudget"]
    args = _scheduler(dep)["args"]
    assert args[args.index("--replicas") + 1] == "1" and _db_env(dep) == []


def test_the_committed_manifests_say_the_same() -> None:
    docs = [d for d in yaml.safe_load_all((REPO / "deploy/manifests/scheduler.yaml").read_text()) if d]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("PersistentVolumeClaim", f"{RELEASE}-state") in kinds
    assert ("PodDisruptionBudget", RELEASE) not in kinds
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"


def test_storage_class_and_an_existing_claim() -> None:
    objs = _objs(_values(**{"persistence.storageClass": "fast", "persistence.size": "5Gi"}))
    claim = objs[("PersistentVolumeClaim", f"{RELEASE}-state")]
    assert claim["spec"]["storageClassName"] == "fast" and claim["spec"]["resources"]["requests"] == {
        "storage": "5Gi"
    }
    objs = _objs(_values(**{"persistence.existingClaim": "mine"}))
    assert not [k for k in objs if k[0] == "PersistentVolumeClaim"]
    dep = objs[("Deployment", RELEASE)]
    assert _state_volume(dep)["persistentVolumeClaim"] == {"claimName": "mine"}
    assert dep["spec"]["strategy"] == {"type": "Recreate"}


def test_persistence_off_is_an_empty_dir_and_a_rolling_update() -> None:
    objs = _objs(_values(**{"persistence.enabled": False}))
    dep = objs[("Deployment", RELEASE)]
    assert _state_volume(dep) == {"name": "state", "emptyDir": {}}
    assert "strategy" not in dep["spec"]
    assert not [k for k in objs if k[0] == "PersistentVolumeClaim"]


def test_two_replicas_on_their_own_sqlite_files_are_refused_naming_the_values() -> None:
    for v in (_values(replicaCount=2), _values(replicaCount=3, **{"persistence.enabled": False})):
        with pytest.raises(ValueError) as err:
            chart_objects(v, NAMESPACE)
        msg = str(err.value)
        assert msg.startswith(f"replicaCount {v['replicaCount']} needs a database the replicas share")
        for name in ("database.url", "database.existingSecret", "database.bundled.enabled"):
            assert name in msg
    with pytest.raises(ValueError, match="use one database"):
        chart_objects(_values(**{"database.bundled.enabled": True, "database.url": PG_URL}), NAMESPACE)


@pytest.mark.parametrize(
    "db",
    [
        {"database.url": PG_URL},
        {"database.existingSecret": "gpupool-database"},
        {"database.bundled.enabled": True},
    ],
    ids=["url", "existingSecret", "bundled"],
)
def test_two_replicas_on_a_shared_database(db: dict[str, Any]) -> None:
    objs = _objs(_values(replicaCount=2, **db))
    dep = objs[("Deployment", RELEASE)]
    assert dep["spec"]["replicas"] == 2 and "strategy" not in dep["spec"]
    assert _state_volume(dep) == {"name": "state", "emptyDir": {}}  # the store is the database
    assert not [k for k in objs if k[0] == "PersistentVolumeClaim"]
    pdb = objs[("PodDisruptionBudget", RELEASE)]
    assert pdb["spec"]["minAvailable"] == 1  # 2 replicas: a drain keeps one, one may go
    args = _scheduler(dep)["args"]
    assert args[args.index("--replicas") + 1] == "2"
    (env,) = _db_env(dep)
    if "database.url" in db:
        assert env["value"] == PG_URL
    else:
        want = "gpupool-database" if "database.existingSecret" in db else f"{RELEASE}-postgresql"
        assert env["valueFrom"] == {"secretKeyRef": {"name": want, "key": "url"}}
    bundled = [
        o for o in objs.values() if o["metadata"]["labels"].get("app.kubernetes.io/component") == "database"
    ]
    assert bool(bundled) == ("database.bundled.enabled" in db)


def test_the_bundled_postgresql_is_valid_and_its_secret_holds_the_url() -> None:
    v = _values(replicaCount=2, **{"database.bundled.enabled": True, "database.bundled.storageClass": "ssd"})
    secret, service, sts = bundled_objects(v, NAMESPACE, password="abc123")
    assert secret["stringData"] == {
        "password": "abc123",
        "url": f"postgresql+psycopg://gpupool:abc123@{RELEASE}-postgresql:5432/gpupool",
    }
    assert service["spec"]["ports"][0]["port"] == 5432
    assert service["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    assert sts["spec"]["replicas"] == 1 and sts["spec"]["serviceName"] == service["metadata"]["name"]
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert (
        claim["spec"]["storageClassName"] == "ssd"
        and claim["spec"]["resources"]["requests"]["storage"] == "8Gi"
    )
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "postgres:16"
    assert {"name": "PGDATA", "value": "/var/lib/postgresql/data/pgdata"} in c["env"]
    for o in (secret, service, sts):
        assert builtin_problems(o, K8S_VERSION) == [], o["kind"]
    other = bundled_objects(v, NAMESPACE)[0]["stringData"]["password"]
    assert re.fullmatch(r"[A-Za-z0-9]{32}", other)  # generated, nothing a URL must escape
    assert bundled_objects(default_values(), NAMESPACE) == []


def test_the_chart_fails_with_the_generators_words() -> None:
    """The chart's ``fail`` messages (templates/_helpers.tpl) are the Python ones, word for word."""
    helpers = (CHART / "templates" / "_helpers.tpl").read_text(encoding="utf-8")
    printf = re.search(r'fail \(printf "([^"]+)" \(int \.Values\.replicaCount\)\)', helpers)
    assert printf is not None and printf.group(1).replace("%d", "{n}") == REPLICAS_NEED_A_SHARED_DATABASE
    assert f'fail "{BUNDLED_AND_URL}"' in helpers
    deployment = (CHART / "templates" / "scheduler-deployment.yaml").read_text(encoding="utf-8")
    assert '{{- include "gpupool.validateValues" . }}' in deployment
    pdb = (CHART / "templates" / "pdb.yaml").read_text(encoding="utf-8")
    assert "{{- if gt (int .Values.replicaCount) 1 }}" in pdb


# -- gpupool serve --replicas ----------------------------------------------------------------------
def test_the_config_refuses_replicas_on_sqlite() -> None:
    assert shared_store_problem(None, 1) is None and shared_store_problem(PG_URL, 3) is None
    for url in (None, "sqlite:////var/lib/gpupool/gpupool.db"):
        msg = shared_store_problem(url, 2)
        assert msg is not None and "--database-url" in msg and "database.url" in msg and "\n" not in msg
    with pytest.raises(ServiceConfigError, match="--replicas 2 with a SQLite database"):
        ServiceConfig(replicas=2)
    assert ServiceConfig(replicas=2, database_url=PG_URL).replicas == 2
    assert ServiceConfig().replicas == 1


def test_serve_refuses_two_replicas_on_sqlite_in_one_line(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "from gpupool.cli import main; main()", "serve", "--replicas", "2"]
    cmd += ["--state-dir", str(tmp_path / "state"), "--port", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --replicas 2 with a SQLite database"), out.stderr
    assert "--database-url" in lines[0] and "database.url" in lines[0] and "Traceback" not in out.stderr
    assert not (tmp_path / "state").exists()  # refused before the store opens
    from gpupool.cli.main import app

    r = CliRunner().invoke(app, ["serve", "--replicas", "2", "--database-url", "sqlite:///x.db"])
    assert r.exit_code == 2 and "sqlite:///x.db" in r.output
    assert CliRunner().invoke(app, ["serve", "--replicas", "0"]).exit_code == 2


# -- the chart itself, where helm is installed ----------------------------------------------------
def _helm(*sets: str) -> subprocess.CompletedProcess[str]:
    cmd = ["helm", "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def _rendered(out: subprocess.CompletedProcess[str]) -> dict[tuple[str, str], dict[str, Any]]:
    assert out.returncode == 0, out.stderr
    return {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(out.stdout) if o}


HELM = pytest.mark.skipif(shutil.which("helm") is None, reason="helm is not installed here")
CASES = {
    "defaults": [],
    "no-persistence": ["persistence.enabled=false"],
    "existing-claim": ["persistence.existingClaim=mine", "persistence.storageClass=fast"],
    "url": ["replicaCount=2", f"database.url={PG_URL}"],
    "secret": ["replicaCount=3", "database.existingSecret=gpupool-database"],
    "bundled": ["replicaCount=2", "database.bundled.enabled=true", "database.bundled.storageClass=ssd"],
}


@HELM
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_helm_renders_what_the_generator_does(case: str) -> None:
    sets = CASES[case]
    v = _values(**{s.partition("=")[0]: _parse(s.partition("=")[2]) for s in sets})
    rendered = _rendered(_helm(*sets))
    generated = _objs(v)
    kinds = ("Deployment", "PersistentVolumeClaim", "PodDisruptionBudget", "StatefulSet")
    compared = {k for k in generated if k[0] in kinds or (k[0] == "Service" and "postgresql" in k[1])}
    assert {k for k in rendered if k[0] in kinds or k in compared} == compared
    for key in compared:
        assert rendered[key] == generated[key], key
    # the generated password differs; the rest of the Secret is the same
    assert (("Secret", f"{RELEASE}-postgresql") in rendered) == (case == "bundled")
    if case == "bundled":
        secret = rendered[("Secret", f"{RELEASE}-postgresql")]
        pw = secret["stringData"]["password"]
        assert re.fullmatch(r"[A-Za-z0-9]{32}", pw)
        assert (
            secret["stringData"]["url"]
            == f"postgresql+psycopg://gpupool:{pw}@{RELEASE}-postgresql:5432/gpupool"
        )


def _parse(raw: str) -> Any:
    """A ``--set`` value as helm reads it: numbers and booleans typed, the rest strings."""
    return raw if raw.startswith("postgresql") else yaml.safe_load(raw)


@HELM
def test_helm_refuses_replicas_without_a_shared_database() -> None:
    out = _helm("replicaCount=2")
    assert out.returncode != 0
    assert REPLICAS_NEED_A_SHARED_DATABASE.format(n=2) in out.stderr, out.stderr
    out = _helm("database.bundled.enabled=true", f"database.url={PG_URL}")
    assert out.returncode != 0 and BUNDLED_AND_URL in out.stderr, out.stderr
