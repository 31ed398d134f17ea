"""The options of ``gpupool serve``, declared once (typer's ``Annotated`` form).

Why a module of their own: ``serve`` takes some forty options; their declarations are read
apart from what the command does with them (``cli/server.py``), so neither grows past reading.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", help="directory of Cluster/ResourcePool/Queue manifests applied on first start"),
]
DatabaseOpt = Annotated[
    str | None,
    typer.Option("--database-url", envvar="GPUPOOL_DATABASE_URL", help="default: sqlite under --state-dir"),
]
BackendOpt = Annotated[str, typer.Option("--backend", help="virtual (simulated nodes), local or kubernetes")]
HostOpt = Annotated[str, typer.Option("--host")]
PortOpt = Annotated[int, typer.Option("--port")]
StateDirOpt = Annotated[
    Path, typer.Option("--state-dir", envvar="GPUPOOL_STATE_DIR", help="database, token and backend state")
]
ReplicasOpt = Annotated[
    int,
    typer.Option(
        "--replicas", min=1, help="replicas of this service that run (2+ need a shared --database-url)"
    ),
]
TimeScaleOpt = Annotated[float, typer.Option("--time-scale", help="virtual seconds per real second")]
TickOpt = Annotated[float, typer.Option("--tick", help="controller tick in seconds")]
FailureRateOpt = Annotated[
    list[str],
    typer.Option(
        "--failure-rate",
        help="virtual backend: abnormal exits per running hour, TYPE=RATE or RATE (repeatable)",
    ),
]
MtbfOpt = Annotated[
    str | None,
    typer.Option("--node-mtbf", help="virtual backend: mean time between node failures, e.g. 400h"),
]
RepairOpt = Annotated[
    str, typer.Option("--node-repair", help="virtual backend: time to repair a failed node")
]
BackoffOpt = Annotated[
    str | None, typer.Option("--retry-backoff", help="first retry delay for every task type")
]
MaxBackoffOpt = Annotated[
    str | None, typer.Option("--retry-max-backoff", help="retry delay cap for every task type")
]
AdvertiseOpt = Annotated[
    str | None,
    typer.Option(
        "--advertise-url",
        help="URL other replicas name as the leader's when they refuse a write (default http://HOST:PORT)",
    ),
]
ReclaimOpt = Annotated[
    bool,
    typer.Option(
        "--lease-reclaim-local/--no-lease-reclaim-local",
        help="take the leader lease over at once when its holder is a dead process on this host",
    ),
]
MetricsPublicOpt = Annotated[
    bool,
    typer.Option("--metrics-public", help="serve /metrics without a token (it names every queue and pool)"),
]
MaxBodyOpt = Annotated[
    int, typer.Option("--max-body-bytes", min=1024, help="largest request body accepted (413 beyond)")
]
LogLevelOpt = Annotated[str, typer.Option("--log-level")]
# the local backend (docs/local.md)
FakeGpusOpt = Annotated[
    str | None,
    typer.Option(
        "--fake-gpus", help="local backend: declare GPUs that do not exist, e.g. 8xH100-80GB (shown as fake)"
    ),
]
UnenforcedOpt = Annotated[
    bool,
    typer.Option(
        "--allow-unenforced", help="local backend: run fractional GPUs WITHOUT isolation (demos only)"
    ),
]
StopGraceOpt = Annotated[
    str, typer.Option("--stop-grace", help="local backend: SIGTERM, then SIGKILL after this")
]
# the kubernetes backend (docs/kubernetes.md; assembled in gpupool.kube.wiring)
KubeconfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--kubeconfig", help="kubernetes backend: kubeconfig file (default: in-cluster, else $KUBECONFIG)"
    ),
]
ContextOpt = Annotated[str | None, typer.Option("--context", help="kubernetes backend: kubeconfig context")]
NamespaceQueueOpt = Annotated[
    list[str],
    typer.Option(
        "--namespace-queue",
        help="kubernetes backend: NS=QUEUE, the queue of a namespace's objects (repeatable)",
    ),
]
RestrictOpt = Annotated[
    bool,
    typer.Option(
        "--restrict-namespace-queues", help="kubernetes backend: a namespace may use only its mapped queues"
    ),
]
LeaseNamespaceOpt = Annotated[
    str | None,
    typer.Option(
        "--lease-namespace", help="kubernetes backend: namespace of the leader Lease (default: the pod's)"
    ),
]


PodsReadyOpt = Annotated[
    str | None,
    typer.Option(
        "--wait-for-pods-ready",
        help="kubernetes backend: evict and requeue a gang not all Ready this long after admission "
        "(Kueue's waitForPodsReady), e.g. 5m; off to disable",
    ),
]
ElasticOpt = Annotated[
    bool | None,
    typer.Option(
        "--elastic/--no-elastic",
        help="kubernetes backend: split gpupool.io/min-replicas Deployments into a guaranteed base "
        "and preemptible extras (default: $GPUPOOL_KUBE_ELASTIC, else off)",
    ),
]
AlertsIntervalOpt = Annotated[
    float | None,
    typer.Option(
        "--alerts-interval",
        help="seconds between the leader's alert evaluations (default: $GPUPOOL_ALERTS_INTERVAL_S, else 30)",
    ),
]

NotificationsOpt = Annotated[
    Path | None,
    typer.Option(
        "--notifications",
        help="NotificationConfig YAML: sinks (webhook, Alertmanager, e-mail) and routes for incidents "
        "(default: $GPUPOOL_NOTIFICATIONS, else notifications.yaml in --state-dir if present)",
    ),
]
