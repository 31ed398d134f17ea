"""``gpupool kube fake``: a fake Kubernetes API server in the foreground, for trying the
Kubernetes backend (and kubectl) on a laptop.

Why the server is imported inside the command: ``gpupool --help`` must not pay for uvicorn and
the fake server's modules.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer

from gpupool.cli.kube_cluster import cluster_app
from gpupool.cli.kube_common import cluster_docs, stop_on_signals
from gpupool.cli.ready import kube_wait

kube_app = typer.Typer(
    help="Kubernetes helpers: a fake API server to run the Kubernetes backend against.", no_args_is_help=True
)
kube_app.command("wait")(kube_wait)
kube_app.add_typer(cluster_app, name="cluster")


@kube_app.command("fake")
def fake(
    port: int = typer.Option(8001, "--port", min=0, max=65535, help="port on 127.0.0.1 (0: any free one)"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
    nodes: int = typer.Option(
        0, "--nodes", min=0, help="this many 8-GPU H100 nodes (ignored with --cluster)"
    ),
    cluster: Path | None = typer.Option(
        None, "--cluster", help="Cluster manifest file or directory (nodeGroups)"
    ),
    kubeconfig: Path = typer.Option(
        Path(".gpupool/fake-kubeconfig"), "--kubeconfig", help="kubeconfig to write"
    ),
    time_scale: float = typer.Option(
        1.0, "--time-scale", min=0.0001, help="multiply run times and grace periods"
    ),
    crds: bool = typer.Option(True, "--crds/--no-crds", help="preload the PyTorchJob and JobSet CRDs"),
) -> None:
    """Serve a fake Kubernetes API server until Ctrl-C (controllers and kubelet simulated)."""
    from gpupool.kube.fake import FakeApiServer

    srv = FakeApiServer(time_scale=time_scale, preload_crds=crds)
    try:
        if cluster is not None:
            made = srv.add_nodes_from_cluster_manifest(cluster_docs(cluster))
        else:
            made = srv.add_gpu_nodes(nodes)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--cluster") from None
    try:
        url = srv.start(host=host, port=port)
    except OSError as exc:
        typer.echo(f"error: cannot listen on {host}:{port}: {exc.strerror}", err=True)
        raise typer.Exit(2) from None
    try:
        stop_on_signals()  # before saying it is up: a signal sent on that line must be honoured
        cfg = srv.write_kubeconfig(kubeconfig)
        typer.echo(f"fake Kubernetes API server at {url} with {len(made)} nodes")
        typer.echo(f"export KUBECONFIG={cfg.resolve()}")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        typer.echo("stopping")
    finally:
        srv.stop()


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add the ``kube`` command group to the gpupool command."""
    app.add_typer(kube_app, name="kube")
