"""Service settings and first-start seeding.

Why: ``gpupool serve`` must work with no arguments on a fresh clone (SQLite under ./.gpupool,
the example cluster), and the same settings object drives tests that point everything at a
temporary directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from gpupool.audit import AuditEntry
from gpupool.manifests import ManifestError, load_files
from gpupool.service.audit_witness import WitnessSettings
from gpupool.service.limits import TenantLimits
from gpupool.service.notify.config import NotificationSpec
from gpupool.service.utilisation import UtilisationSettings
from gpupool.store import OBJECT_KINDS, Store

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
DEFAULT_STATE_DIR = Path(".gpupool")


def shared_store_problem(database_url: str | None, replicas: int) -> str | None:
    """Why ``replicas`` schedulers cannot run on this database, or None.

    Why refuse: replicas elect one leader, and the one that takes over works from the store; on
    SQLite each replica has its own file (``--state-dir``, an emptyDir or its own volume), so a
    failover would start from an empty store. ``database_url`` None is SQLite under the state dir.
    """
    if replicas <= 1 or (database_url and not database_url.startswith("sqlite")):
        return None
    where = f" ({database_url})" if database_url else " (the default, under --state-dir)"
    return (
        f"--replicas {replicas} with a SQLite database{where}: each replica would keep its own store"
        " and a failover would start from an empty one; give them a shared PostgreSQL database with"
        " --database-url or $GPUPOOL_DATABASE_URL (chart: database.url, database.existingSecret or"
        " database.bundled.enabled), or run one replica"
    )


class ServiceConfigError(ValueError):
    """Settings that cannot run together (the message says which and what to set)."""


@dataclass(slots=True)
class ServiceConfig:
    """Everything ``gpupool serve`` can be told."""

    state_dir: Path = field(default_factory=lambda: DEFAULT_STATE_DIR)
    database_url: str | None = None  # default: sqlite:///<state_dir>/gpupool.db
    config_dir: Path | None = field(default_factory=lambda: EXAMPLES / "cluster")
    backend: str = "virtual"
    time_scale: float = 60.0
    tick_s: float = 1.0
    min_interval_s: float = 0.02
    host: str = "127.0.0.1"
    port: int = 8080
    write_token_file: bool = True
    #: failures injected by the virtual backend (off by default): abnormal exits per running hour
    #: by task type ("*": any type), node mean time between failures and repair (virtual seconds)
    failure_rates: dict[str, float] = field(default_factory=dict)
    node_mtbf_s: float | None = None
    node_repair_s: float = 7200.0
    #: retry backoff base and cap for every task type (None: the defaults by type, docs/service.md)
    retry_backoff_s: float | None = None
    retry_max_backoff_s: float | None = None
    #: request limits (gpupool.service.guard): body bytes and JSON nesting depth
    max_body_bytes: int = 4 << 20
    max_json_depth: int = 32
    #: /metrics without a token (it names every queue); off by default, see docs/service.md
    metrics_public: bool = False
    #: the URL other replicas name as the leader's (default http://HOST:PORT); see gpupool.service.leader
    advertise_url: str | None = None
    #: leader lease: valid this long after each renewal; renewed this often; standbys try this often
    #: (a standby takes over at most lease_ttl_s + lease_retry_s after the leader's last renewal)
    lease_ttl_s: float = 8.0
    lease_renew_s: float = 2.0
    lease_retry_s: float = 1.0
    #: take the lease over at once from a holder that is a dead process on this host (kill -9)
    lease_reclaim_local: bool = True
    #: how often the leader evaluates the alert rules (None: $GPUPOOL_ALERTS_INTERVAL_S, else 30 s)
    alerts_interval_s: float | None = None
    #: how many replicas of this service run (the chart's replicaCount): 2+ need a shared database
    replicas: int = 1
    #: measured GPU utilisation: idle threshold, default idleFor, sampling, retention, Prometheus
    #: (None: read from $GPUPOOL_UTILISATION_* when the config is made, gpupool.service.utilisation)
    utilisation: UtilisationSettings | None = None
    #: where incidents are notified (None: nowhere; gpupool serve --notifications FILE)
    notifications: NotificationSpec | None = None
    #: pending limits' defaults and the submit rate per token (gpupool.service.limits)
    tenant_limits: TenantLimits = field(default_factory=TenantLimits)
    #: signed audit checkpoints taken by the server (None: off; gpupool serve turns it on)
    audit_witness: WitnessSettings | None = None

    def __post_init__(self) -> None:
        problem = shared_store_problem(self.database_url, self.replicas)
        if problem is not None:
            raise ServiceConfigError(problem)
        if self.utilisation is None:
            try:
                self.utilisation = UtilisationSettings.from_env()
            except ValueError as exc:  # the message names the variable
                raise ServiceConfigError(str(exc)) from None

    @property
    def url(self) -> str:
        return self.database_url or f"sqlite:///{self.state_dir / 'gpupool.db'}"

    @property
    def leader_url(self) -> str:
        return self.advertise_url or f"http://{self.host}:{self.port}"

    @property
    def token_file(self) -> Path:
        return self.state_dir / "admin-token"

    @property
    def backend_state_file(self) -> Path:
        return self.state_dir / "virtual-cluster.json"


def seed_config(store: Store, config_dir: Path | None) -> int:
    """On first start (no configuration stored yet) apply the manifests of ``config_dir``.

    Later starts leave the stored configuration alone: it is managed through the API from then
    on, and a deleted queue must not come back on restart. Returns the number of objects applied.
    """
    if config_dir is None or store.list_objects():
        return 0
    if not config_dir.exists():
        raise FileNotFoundError(f"configuration directory {config_dir} does not exist")
    try:
        docs = load_files([config_dir])
    except ManifestError:
        raise
    n = 0
    for d in docs:
        if d.kind not in OBJECT_KINDS:
            continue
        manifest = {k: v for k, v in d.raw.items() if k != "status"}
        store.apply_object(
            manifest,
            audit=AuditEntry("system", "config.seed", d.kind, d.name, {"source": str(d.source)}),
        )
        n += 1
    return n


def write_token_file(path: Path, token: str) -> None:
    """Write the bootstrap token readable by the owner only (0600 from the first byte)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)
