"""``gpupool kube cluster up``: a real local Kubernetes control plane (etcd, kube-apiserver,
kube-controller-manager from ``make kube-bin``) with simulated GPU nodes, in the foreground
until Ctrl-C or SIGTERM, like ``gpupool kube fake`` (issue 24).

Why the work is imported inside the command: ``gpupool --help`` must not pay for the control
plane's certificate code or the node builders.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer
import yaml

from gpupool.cli.kube_common import cluster_docs, stop_on_signals

if TYPE_CHECKING:
    from gpupool.kube.realcluster import RealControlPlane

cluster_app = typer.Typer(
    help="A real local Kubernetes control plane with simulated GPU nodes (needs `make kube-bin`).",
    no_args_is_help=True,
)


@cluster_app.command("up")
def cluster_up(
    nodes: int = typer.Option(
        0, "--nodes", min=0, help="this many 8-GPU H100 nodes (ignored with --cluster)"
    ),
    cluster: Path | None = typer.Option(
        None, "--cluster", help="Cluster manifest file or directory (nodeGroups)"
    ),
    kubeconfig: Path = typer.Option(
        Path(".gpupool/kube-kubeconfig"), "--kubeconfig", help="kubeconfig to write once the nodes are Ready"
    ),
    time_scale: float = typer.Option(
        1.0, "--time-scale", min=0.0001, help="multiply run times and grace periods"
    ),
    heartbeat: float = typer.Option(
        10.0, "--heartbeat-seconds", min=0.1, help="how often each node renews its Lease"
    ),
    with_scheduler: bool = typer.Option(False, "--with-scheduler", help="also run kube-scheduler"),
    with_kueue: bool = typer.Option(
        False, "--with-kueue", help="also run Kueue's manager (CRDs, RBAC, webhooks) and kube-scheduler"
    ),
) -> None:
    """Run etcd, kube-apiserver, kube-controller-manager and a node agent (the nodes' kubelets)
    until Ctrl-C. Without --with-scheduler/--with-kueue no kube-scheduler runs: pods wait until
    something binds them (gpupool)."""
    from gpupool.kube import kueue_local
    from gpupool.kube.client import KubeApi, load_config
    from gpupool.kube.fake import nodes as builders
    from gpupool.kube.nodeagent import NodeAgent
    from gpupool.kube.realcluster import (
        KUBERNETES_VERSION,
        MissingBinaries,
        RealClusterError,
        RealControlPlane,
    )

    try:
        objs = builders.nodes_from_cluster(cluster_docs(cluster)) if cluster else builders.gpu_nodes(nodes)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--cluster") from None
    try:
        cp = RealControlPlane(addons=kueue_local.addons(with_scheduler, with_kueue))
    except MissingBinaries as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    agent: NodeAgent | None = None
    api: KubeApi | None = None
    stop_on_signals()  # first: a Ctrl-C during the ~15 s start must still stop what started
    try:
        try:
            cp.start()
        except MissingBinaries as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        api = KubeApi(load_config(str(cp.kubeconfig)))
        # kube-scheduler writes no HAMi device annotations: with it the nodes act as with
        # NVIDIA's plain device plugin (whole GPUs), not HAMi's, so its pods are not refused.
        agent = NodeAgent(api, objs, time_scale=time_scale, heartbeat_s=heartbeat, use_hami=not cp.scheduler)
        agent.start()
        agent.wait_ready(120)
        _announce(cp, len(objs), _write_kubeconfig(cp, kubeconfig), KUBERNETES_VERSION)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        typer.echo("stopping")
    except (RealClusterError, TimeoutError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        _ignore_signals()  # the cleanup itself must not be cut short by a second signal
        if agent is not None:
            agent.stop()
        if api is not None:
            api.close()
        cp.stop()


def _announce(cp: RealControlPlane, nodes: int, cfg: Path, version: str) -> None:
    """The 'up' line (what runs, where) and the export line, once the nodes are Ready."""
    extra = ", kube-scheduler" if cp.scheduler else "; no kube-scheduler"
    extra = ", kube-scheduler, Kueue v0.17.0" if cp.kueue else extra
    typer.echo(
        f"up: Kubernetes {version} API server at {cp.server} with {nodes} nodes Ready"
        f" (etcd, kube-apiserver, kube-controller-manager, node agent{extra})"
    )
    typer.echo(f"export KUBECONFIG={cfg.resolve()}")


def _ignore_signals() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _write_kubeconfig(cp: RealControlPlane, path: Path) -> Path:
    """The admin kubeconfig, self-contained (the CA embedded: the control plane's own files
    are in a temporary directory that goes with it)."""
    ca = base64.b64encode(cp.ca_file.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "gpupool-local", "cluster": {"server": cp.server, "certificate-authority-data": ca}}
        ],
        "users": [{"name": "admin", "user": {"token": cp.admin_token}}],
        "contexts": [{"name": "gpupool-local", "context": {"cluster": "gpupool-local", "user": "admin"}}],
        "current-context": "gpupool-local",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    tmp.chmod(0o600)
    tmp.replace(path)
    return path
