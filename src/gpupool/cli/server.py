"""``gpupool serve``: the control plane (API + controller + store) in one process.

Why bootstrap before uvicorn starts: the first start must print the admin token and the next
command to run, and that is only possible if the token exists before the server logs anything.
"""

from __future__ import annotations

import contextlib
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from gpupool.cli import server_audit, server_limits
from gpupool.cli.server_options import (
    AdvertiseOpt,
    AlertsIntervalOpt,
    BackendOpt,
    BackoffOpt,
    ConfigOpt,
    ContextOpt,
    DatabaseOpt,
    ElasticOpt,
    FailureRateOpt,
    FakeGpusOpt,
    HostOpt,
    KubeconfigOpt,
    LeaseNamespaceOpt,
    LogLevelOpt,
    MaxBackoffOpt,
    MaxBodyOpt,
    MetricsPublicOpt,
    MtbfOpt,
    NamespaceQueueOpt,
    NotificationsOpt,
    PodsReadyOpt,
    PortOpt,
    ReclaimOpt,
    RepairOpt,
    ReplicasOpt,
    RestrictOpt,
    StateDirOpt,
    StopGraceOpt,
    TickOpt,
    TimeScaleOpt,
    UnenforcedOpt,
)
from gpupool.cli.server_tls import TlsCertOpt, TlsKeyOpt, UvicornTls, scheme, uvicorn_tls
from gpupool.service.config import (
    DEFAULT_STATE_DIR,
    EXAMPLES,
    ServiceConfig,
    seed_config,
    shared_store_problem,
    write_token_file,
)
from gpupool.service.utilisation import UtilisationSettings

# a log file or journald gets each banner line whole, never wrapped at 80 columns
console = Console(soft_wrap=not sys.stdout.isatty())
err_console = Console(stderr=True, soft_wrap=not sys.stderr.isatty())


def _fault_options(
    rates: list[str], mtbf: str | None, repair: str, backoff: str | None, cap: str | None
) -> dict[str, Any]:
    """ServiceConfig fields for injected failures and the retry backoff; exits 2 naming a bad option."""
    from gpupool.quantity import QuantityError, parse_duration
    from gpupool.service.failures.policy import parse_failure_rates

    out: dict[str, Any] = {}
    try:
        out["failure_rates"] = parse_failure_rates(rates)
    except ValueError as exc:
        _fail(str(exc))
    for opt, key, v in (
        ("--node-mtbf", "node_mtbf_s", mtbf),
        ("--node-repair", "node_repair_s", repair),
        ("--retry-backoff", "retry_backoff_s", backoff),
        ("--retry-max-backoff", "retry_max_backoff_s", cap),
    ):
        if v is None:
            continue
        try:
            out[key] = parse_duration(v)
        except QuantityError as exc:
            _fail(f"{opt} {v!r}: {exc}")
        if out[key] <= 0 and key == "node_mtbf_s":
            _fail(f"{opt} {v!r}: must be > 0")
    return out


def _fail(msg: str) -> NoReturn:
    # the message is data (names, patterns, reasons): brackets in it are not styling
    err_console.print(f"[red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


# -- the local backend (gpupool serve --backend local) ---------------------------------------
def _local_backend(
    backend: str, state_dir: Path, config: Path | None, fake_gpus: str | None, unenforced: bool, grace: str
) -> tuple[Any, Path | None] | None:
    """The local backend and the configuration to seed (this host's, unless --config is given);
    None for other backends. Exits 2 naming a bad option."""
    from gpupool.quantity import QuantityError, parse_duration

    if backend != "local":
        for opt, v in (("--fake-gpus", fake_gpus), ("--allow-unenforced", unenforced)):
            if v:
                _fail(f"{opt} applies to --backend local only")
        return None
    from gpupool.service.backends.local import LocalBackend
    from gpupool.service.backends.local_host import seed_manifests, write_config_dir

    try:
        grace_s = parse_duration(grace)
        be = LocalBackend(state_dir, fake_gpus=fake_gpus, allow_unenforced=unenforced, grace_s=grace_s)
    except QuantityError as exc:
        _fail(f"--stop-grace {grace!r}: {exc}")
    except ValueError as exc:  # --fake-gpus, with the option named
        _fail(str(exc))
    seed = config or write_config_dir(state_dir / "local-config", seed_manifests(be.cluster_manifest()))
    return be, seed


def _local_banner(be: Any) -> None:
    h = be.health().detail
    gpus = h["gpus"]
    what = f"{len(gpus['devices'])} GPUs" + (" (FAKE: --fake-gpus)" if h["fakeGpus"] else "")
    console.print(f"local backend: node {h['node']}, {what}, fractional GPUs: {h['fractionalGpus']}")
    if gpus.get("note"):
        console.print(f"  {gpus['note']}")
    if h.get("warning"):
        console.print(f"  [bold red]WARNING[/]: {escape(h['warning'])}")


# -- the kubernetes backend (gpupool serve --backend kubernetes) ----------------------------
def _kube_options(
    backend: str,
    kubeconfig: Path | None,
    context: str | None,
    namespace_queues: list[str],
    restrict: bool,
    lease_namespace: str | None,
    extras: KubeExtras | None = None,
) -> Any:
    """The Kubernetes backend's runtime (gpupool.kube.wiring), already connecting so its caches
    fill while the store opens; None for other backends. Exits 2 naming a bad option."""
    extras = extras or KubeExtras()
    if backend != "kubernetes":
        for opt, v in (
            ("--kubeconfig", kubeconfig),
            ("--context", context),
            ("--namespace-queue", namespace_queues),
            ("--restrict-namespace-queues", restrict),
            ("--lease-namespace", lease_namespace),
            ("--wait-for-pods-ready", extras.wait_for_pods_ready),
            ("--elastic/--no-elastic", extras.elastic is not None),
        ):
            if v:
                _fail(f"{opt} applies to --backend kubernetes only")
        return None
    from gpupool.kube.wiring import kube_options, kube_runtime

    try:
        opts = kube_options(
            kubeconfig,
            context,
            namespace_queues,
            restrict,
            lease_namespace,
            pods_ready=_pods_ready_option(extras.wait_for_pods_ready),
            elastic=extras.elastic,
            reclaim_local=extras.reclaim_local,
        )
        return kube_runtime(opts)
    except ValueError as exc:
        _fail(str(exc))


@dataclass(frozen=True)
class KubeExtras:
    """serve's Kubernetes switches beyond the connection: Kueue's waitForPodsReady timeout and
    elastic inference (None: the environment's $GPUPOOL_KUBE_WAIT_FOR_PODS_READY and
    $GPUPOOL_KUBE_ELASTIC decide, as in the chart)."""

    wait_for_pods_ready: str | None = None
    elastic: bool | None = None
    #: --lease-reclaim-local: also for the Kubernetes Lease (it applied to the store's only)
    reclaim_local: bool = True


def _pods_ready_option(value: str | None) -> Any:
    """``--wait-for-pods-ready 5m`` turns the timeout on; ``off`` turns it off; unset: the env."""
    if value is None:
        return None
    if value.strip().lower() in ("off", "false", "no"):
        return {"enable": False}
    return {"enable": True, "timeout": value}


def _alerts_interval(value: float | None) -> float:
    """--alerts-interval, else $GPUPOOL_ALERTS_INTERVAL_S, checked before anything starts (a bad
    value would otherwise fail inside uvicorn's start-up, under a traceback)."""
    from gpupool.service.alerts import interval_from_env

    if value is not None:
        if not 0 < value <= 86400:
            _fail(f"--alerts-interval {value:g}: must be > 0 and at most 86400 seconds")
        return value
    try:
        return interval_from_env()
    except ValueError as exc:
        _fail(str(exc))


def _utilisation() -> UtilisationSettings:
    """Measured utilisation's settings (docs/metrics.md): $GPUPOOL_UTILISATION_*, named when wrong."""
    try:
        return UtilisationSettings.from_env()
    except ValueError as exc:
        _fail(str(exc))


def _notifications(given: Path | None, state_dir: Path) -> Any:
    """The NotificationConfig in force (--notifications, $GPUPOOL_NOTIFICATIONS, else
    notifications.yaml in the state directory if there is one), checked before anything starts:
    every problem is one line naming the file, line and field."""
    from gpupool.service.notify import NotificationConfigError, config_path, load_config

    path = config_path(given, state_dir)
    if path is None:
        return None
    try:
        return load_config(path)
    except NotificationConfigError as exc:
        _fail(f"--notifications: {len(exc.errors)} problem(s):\n" + "\n".join(exc.errors))


# -- serve's options: one named declaration each, so the command reads as its outline --------
def serve(
    config: ConfigOpt = None,
    database_url: DatabaseOpt = None,
    backend: BackendOpt = "virtual",
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8080,
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    time_scale: TimeScaleOpt = 60.0,
    tick: TickOpt = 1.0,
    failure_rate: FailureRateOpt = [],  # noqa: B006 (typer copies list defaults)
    node_mtbf: MtbfOpt = None,
    node_repair: RepairOpt = "2h",
    retry_backoff: BackoffOpt = None,
    retry_max_backoff: MaxBackoffOpt = None,
    advertise_url: AdvertiseOpt = None,
    reclaim_local: ReclaimOpt = True,
    metrics_public: MetricsPublicOpt = False,
    max_body_bytes: MaxBodyOpt = 4 << 20,
    fake_gpus: FakeGpusOpt = None,
    allow_unenforced: UnenforcedOpt = False,
    stop_grace: StopGraceOpt = "10s",
    log_level: LogLevelOpt = "warning",
    kubeconfig: KubeconfigOpt = None,
    kube_context: ContextOpt = None,
    namespace_queue: NamespaceQueueOpt = [],  # noqa: B006
    restrict_namespace_queues: RestrictOpt = False,
    lease_namespace: LeaseNamespaceOpt = None,
    wait_for_pods_ready: PodsReadyOpt = None,
    elastic: ElasticOpt = None,
    alerts_interval: AlertsIntervalOpt = None,
    notifications: NotificationsOpt = None,
    replicas: ReplicasOpt = 1,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    pending_limit: server_limits.PendingLimitOpt = [],  # noqa: B006 (typer copies list defaults)
    submit_rate: server_limits.SubmitRateOpt = None,
    submit_burst: server_limits.SubmitBurstOpt = None,
    audit_checkpoint_every: server_audit.AuditEveryOpt = "10m",
    audit_witness: server_audit.AuditWitnessOpt = None,
    audit_key: server_audit.AuditKeyOpt = None,
) -> None:
    """Run the gpupool control plane: REST API, controller loop and store."""
    _check_start(backend, database_url, replicas, time_scale)
    alerts_interval_s = _alerts_interval(alerts_interval)
    extras = KubeExtras(wait_for_pods_ready, elastic, reclaim_local)
    kube = _kube_options(
        backend, kubeconfig, kube_context, namespace_queue, restrict_namespace_queues, lease_namespace, extras
    )
    local = _local_backend(backend, state_dir, config, fake_gpus, allow_unenforced, stop_grace)
    cfg_dir = _config_dir(config, local)
    tls = uvicorn_tls(tls_cert, tls_key)
    advertise_url = _advertise(advertise_url, tls, host, port)
    cfg = ServiceConfig(
        utilisation=_utilisation(),
        audit_witness=server_audit.settings(audit_checkpoint_every, audit_witness, audit_key, state_dir),
        metrics_public=metrics_public,
        max_body_bytes=max_body_bytes,
        advertise_url=advertise_url,
        lease_reclaim_local=reclaim_local,
        alerts_interval_s=alerts_interval_s,
        notifications=_notifications(notifications, state_dir),
        replicas=replicas,
        tenant_limits=server_limits.tenant_limits(pending_limit, submit_rate, submit_burst),
        state_dir=state_dir,
        database_url=database_url,
        config_dir=cfg_dir,
        backend=backend,
        time_scale=time_scale,
        tick_s=tick,
        **_fault_options(failure_rate, node_mtbf, node_repair, retry_backoff, retry_max_backoff),
        host=host,
        port=port,
    )
    if not _port_free(host, port):
        _fail(f"cannot listen on {host}:{port}: the address is in use (pick another with --port)")
    seeded, token = _bootstrap(cfg, local)
    _banner(cfg, seeded, token, local, scheme(tls))
    _config_line(cfg, seeded, given=config is not None)
    _run(cfg, kube, local, log_level, tls)


def _check_start(backend: str, database_url: str | None, replicas: int, time_scale: float) -> None:
    """What ``serve`` refuses before it connects to a cluster or opens a store."""
    if backend not in ("virtual", "local", "kubernetes"):
        _fail(f"unknown backend {backend!r}; available: virtual, local, kubernetes")
    if (store_problem := shared_store_problem(database_url, replicas)) is not None:
        _fail(store_problem)
    if time_scale <= 0:
        _fail("--time-scale must be > 0")


def _advertise(url: str | None, tls: Any, host: str, port: int) -> str | None:
    """The URL other replicas name this one by: given, else https with TLS (the scheme it answers)."""
    if tls and url is None:
        url = f"https://{host}:{port}"
    if url is not None and not url.startswith(("http://", "https://")):
        _fail(f"--advertise-url {url!r}: must be an http:// or https:// URL")
    return url


def _config_dir(config: Path | None, local: tuple[Any, Path | None] | None) -> Path:
    """--config, this host's generated configuration (local backend), or the packaged defaults."""
    from gpupool.defaults import default_config_dir

    cfg_dir = config if config is not None else default_config_dir(EXAMPLES)
    cfg_dir = local[1] if local is not None and local[1] is not None else cfg_dir
    if not cfg_dir.is_dir():
        _fail(f"--config {cfg_dir}: not a directory")
    return cfg_dir


def _bootstrap(cfg: ServiceConfig, local: tuple[Any, Path | None] | None) -> tuple[int, str | None]:
    """Open the store, seed the configuration, make the first admin token: (objects seeded, token).
    Why before uvicorn: the token must exist before the server logs anything."""
    from gpupool.store import Store

    try:
        store = Store.open(cfg.url)
    except Exception as exc:  # a bad URL or an unreachable database: one line, no traceback
        _fail(f"cannot open the database {cfg.url}: {str(exc).splitlines()[0]}")
    try:
        try:
            seeded = seed_config(store, cfg.config_dir)
            if local is not None:  # this host as it is now (GPUs may have changed since)
                from gpupool.service.backends.local_host import sync_cluster

                sync_cluster(store, local[0].cluster_manifest())
        except Exception as exc:
            _fail(f"cannot load the configuration from {cfg.config_dir}: {str(exc).splitlines()[0]}")
        return seeded, store.ensure_bootstrap_admin()
    finally:
        store.close()


def _banner(
    cfg: ServiceConfig,
    seeded: int,
    token: str | None,
    local: tuple[Any, Path | None] | None,
    url_scheme: str = "http",
) -> None:
    """Where it serves, the configuration, where the token is, and the next command to run."""
    url = f"{url_scheme}://{cfg.host}:{cfg.port}"
    console.print(
        f"[bold]gpupool[/] serving on {url}  (dashboard {url}/, API docs {url}/docs, database {cfg.url})"
    )
    if token is not None:
        write_token_file(cfg.token_file, token)
        # a token on stdout ends up in journald and CI logs: print it only to a person
        shown = token if console.is_terminal else "created (not printed: stdout is not a terminal)"
        console.print(f"bootstrap admin token: {shown}", markup=False)
        told = "by default" if cfg.state_dir == DEFAULT_STATE_DIR else "when pointed at this state dir"
        console.print(f"  saved to {cfg.token_file} (mode 0600); the CLI reads it from there {told}")
    else:
        console.print(f"admin token: in {cfg.token_file} (created on first start)")
    if cfg.state_dir != DEFAULT_STATE_DIR:  # the CLI looks in ./.gpupool unless told
        console.print(
            f"  for the CLI:  export GPUPOOL_STATE_DIR={cfg.state_dir.absolute()}  (or gpupool --state-dir DIR ...)"
        )
    server_hint = "" if (cfg.host, cfg.port) == ("127.0.0.1", 8080) else f" --server {url}"
    if local is not None:
        _local_banner(local[0])
        console.print("a workload that runs a command on this host: docs/local.md")
    console.print(f"submit a job:  gpupool submit -f examples/workloads/demo.yaml{server_hint}")
    console.print(f"then:          gpupool get workloads{server_hint}")
    console.print(server_audit.banner(cfg.audit_witness), markup=False)


def _config_line(cfg: ServiceConfig, seeded: int, given: bool) -> None:
    """Say which configuration is in force, so nobody wonders where a queue came from: the
    directory seeded on a first start (and whether it is the example), or the stored one."""
    if seeded:
        example = "" if given else " (the example configuration: no --config was given)"
        console.print(f"configuration: {seeded} objects from {cfg.config_dir}{example}")
    elif given:
        console.print(
            f"configuration: the stored one; --config {cfg.config_dir} is applied on a first start "
            f"only: `gpupool apply -f {cfg.config_dir}` changes it"
        )
    else:
        console.print("configuration: the stored one (`gpupool get pools`, `gpupool get queues` show it)")


def _run(
    cfg: ServiceConfig,
    kube: Any,
    local: tuple[Any, Path | None] | None,
    log_level: str,
    tls: UvicornTls,
) -> None:
    """Serve until interrupted: the Kubernetes runtime's app, or the app over the virtual or
    local backend."""
    import uvicorn

    from gpupool.service.api import create_app

    with contextlib.suppress(KeyboardInterrupt):
        if kube is not None:
            from gpupool.kube.wiring import kube_app

            uvicorn.run(kube_app(cfg, kube), host=cfg.host, port=cfg.port, log_level=log_level, **tls)
            return
        app = create_app(cfg, backend=local[0] if local else None)
        uvicorn.run(app, host=cfg.host, port=cfg.port, log_level=log_level, **tls)


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``serve`` and ``bench submit`` to the gpupool command."""
    app.command("serve")(serve)
    from gpupool.bench.submit import bench_submit_command

    bench_app.command("submit")(bench_submit_command)
    from gpupool.bench.burst import bench_burst_command

    bench_app.command("burst")(bench_burst_command)
