"""``gpupool deploy``: print or write what a cluster install needs (CRDs, plain manifests).

Why a command: the committed files under ``charts/gpupool/crds`` and ``deploy/manifests`` are
this command's output; after changing the models, ``gpupool deploy crds --out charts/gpupool/crds``
refreshes them, and the tests say when someone forgot.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from gpupool.kube.client import KubeApi

deploy_app = typer.Typer(
    help="Kubernetes install files generated from gpupool's sources.", no_args_is_help=True
)


def crd_files() -> dict[str, str]:
    """The CRD files as committed under charts/gpupool/crds: one CRD per file."""
    from gpupool.deploy.crds import all_crds, crd_file_name
    from gpupool.deploy.render import dump

    return {crd_file_name(c): dump([c], "crds") for c in all_crds()}


def _emit(files: dict[str, str], out: Path | None) -> None:
    from gpupool.deploy.render import write_files

    if out is None:
        typer.echo("".join(files.values()), nl=False)
        return
    for path in write_files(files, out):
        typer.echo(f"wrote {path}")


@deploy_app.command("crds")
def crds_command(
    out: Path | None = typer.Option(None, "--out", help="write one file per CRD into this directory"),
    apply: bool = typer.Option(
        False, "--apply", help="create or update them in the cluster (the chart's upgrade hook)"
    ),
    kubeconfig: Path | None = typer.Option(
        None, "--kubeconfig", help="with --apply; default: in-cluster, else $KUBECONFIG"
    ),
) -> None:
    """gpupool's CustomResourceDefinitions (ResourcePool, Queue, Workload) as YAML."""
    if not apply:
        _emit(crd_files(), out)
        return
    from gpupool.deploy.upgrade import apply_crds
    from gpupool.kube.client import ApiError

    api = _connect(kubeconfig)
    try:
        for name, what in apply_crds(api):
            typer.echo(f"customresourcedefinition/{name}: {what}")
    except ApiError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        api.close()


def _connect(kubeconfig: Path | None) -> KubeApi:
    """A KubeApi from --kubeconfig (or in-cluster); exits 2 naming what is missing."""
    from gpupool.kube.client import KubeApi, KubeConfigError, load_config

    try:
        return KubeApi(load_config(str(kubeconfig) if kubeconfig else None))
    except KubeConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@deploy_app.command("manifests")
def manifests_command(
    out: Path | None = typer.Option(None, "--out", help="write the files (and kustomization.yaml) here"),
    namespace: str = typer.Option("gpupool-system", "--namespace", help="the namespace gpupool runs in"),
) -> None:
    """The chart's objects at its default values as plain YAML (``kubectl apply -k`` the directory)."""
    from gpupool.deploy.manifests import manifest_files
    from gpupool.deploy.values import default_values

    files = manifest_files(default_values(), namespace)
    if out is None:
        files = {k: v for k, v in files.items() if not k.endswith("kustomization.yaml")}
    _emit(files, out)


@deploy_app.command("certs")
def certs_command(
    namespace: str = typer.Option(..., "--namespace", help="the webhook Service's namespace"),
    service: str = typer.Option(..., "--service", help="the webhook Service"),
    secret: str = typer.Option(
        ..., "--secret", help="the kubernetes.io/tls Secret to keep the certificate in"
    ),
    webhook: str = typer.Option(
        ..., "--webhook", help="the Mutating/ValidatingWebhookConfiguration to trust it"
    ),
    step: str = typer.Option("all", "--step", help="all, secret (Helm pre-install) or patch (post-install)"),
    kubeconfig: Path | None = typer.Option(
        None, "--kubeconfig", help="default: in-cluster, else $KUBECONFIG"
    ),
) -> None:
    """Make (or keep) the webhooks' serving certificate and write its CA into the webhook configurations."""
    from gpupool.deploy.certs import ensure_secret, read_bundle, write_ca_bundle
    from gpupool.kube.client import ApiError

    if step not in ("all", "secret", "patch"):
        typer.echo(f"error: --step {step!r}: must be all, secret or patch", err=True)
        raise typer.Exit(2)
    api = _connect(kubeconfig)
    try:
        if step == "patch":
            bundle = read_bundle(api, namespace, secret)
        else:
            made, bundle = ensure_secret(api, namespace, service, secret)
            typer.echo(f"Secret {namespace}/{secret}: {'created' if made else 'kept (still valid)'}")
        if step != "secret":
            n = write_ca_bundle(api, webhook, bundle)
            typer.echo(f"CA bundle written to {n} webhooks of {webhook}")
    except (ApiError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        api.close()


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``gpupool deploy`` to the gpupool command."""
    app.add_typer(deploy_app, name="deploy")


@deploy_app.command("webhook-server")
def webhook_server_command(
    port: int = typer.Option(9443, "--port"),
    host: str = typer.Option("0.0.0.0", "--host"),  # in a pod: the Service reaches it on the pod IP
    cert_file: Path | None = typer.Option(None, "--tls-cert-file", envvar="GPUPOOL_TLS_CERT_FILE"),
    key_file: Path | None = typer.Option(None, "--tls-key-file", envvar="GPUPOOL_TLS_KEY_FILE"),
    log_level: str = typer.Option("warning", "--log-level"),
    namespace_labels: bool = typer.Option(
        True,
        "--namespace-labels/--no-namespace-labels",
        help="read namespaces' gpupool.io/queue label from the cluster (in a pod, or with --kubeconfig)",
    ),
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help="for --namespace-labels outside a pod"),
) -> None:
    """Serve the admission webhooks (and /healthz) over TLS, as the chart's webhook container does."""
    import os

    import uvicorn

    from gpupool.service.routes.webhooks import webhook_app

    if (cert_file is None) != (key_file is None):
        typer.echo("error: --tls-cert-file and --tls-key-file go together", err=True)
        raise typer.Exit(2)
    for opt, f in (("--tls-cert-file", cert_file), ("--tls-key-file", key_file)):
        if f is not None and not f.is_file():
            typer.echo(f"error: {opt} {f}: not a file", err=True)
            raise typer.Exit(2)
    ssl = {"ssl_certfile": str(cert_file), "ssl_keyfile": str(key_file)} if cert_file and key_file else {}
    lookup = None
    if namespace_labels and (kubeconfig is not None or os.environ.get("KUBERNETES_SERVICE_HOST")):
        from gpupool.deploy.namespaces import NamespaceQueues

        lookup = NamespaceQueues(_connect(kubeconfig))
    app = webhook_app(lookup)
    uvicorn.run(app, host=host, port=port, log_level=log_level, **ssl)  # type: ignore[arg-type]
