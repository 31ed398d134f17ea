"""The REST API (FastAPI): the application, its lifespan, and the areas it is made of.

Where things are (see docs/service.md):
* ``gpupool.service.routes``: one APIRouter per area (health, tokens, config, workloads,
  approvals, cluster, audit); ``routes.base`` holds what they share (the error handlers, the
  Caller/Svc dependencies) and the conventions every endpoint follows.
* ``gpupool.service.usecases``: what the routes, the CLI, the Kubernetes source and the
  backends all call (submit, apply, cancel, drain, device health, onboard), over the
  ``Service`` (``gpupool.service.core``) and raising ``gpupool.service.errors.ApiError``.
* ``gpupool.service.admission``: whether a submission is refused, needs an approver, or asks
  for an exception.
* ``gpupool.service.readmodel``: what the API shows of the controller's state.

This module wires them: the store, backend and controller start with the app (lifespan); the
error handlers, guards and routers are installed; the hot submit route is matched first.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette.routing import Route

from gpupool.service import openapi as oa
from gpupool.service.alerts import RULES, AlertLoop
from gpupool.service.audit_witness import AuditWitness, start_witness
from gpupool.service.backends import Backend, Capability, capability
from gpupool.service.backends.builtin import make_builtin_backend
from gpupool.service.batch import SubmitBatcher
from gpupool.service.config import ServiceConfig, seed_config, write_token_file
from gpupool.service.controller import Controller
from gpupool.service.core import Service
from gpupool.service.errors import ApiError
from gpupool.service.guard import RequestGuard
from gpupool.service.hsts import StrictTransport
from gpupool.service.leader import install_standby_guard, start_leader
from gpupool.service.metrics import Metrics
from gpupool.service.notify.dispatch import start_notifier
from gpupool.service.routes import alerts as alerts_area
from gpupool.service.routes import approvals, audit, catalog, cluster, health, tokens, webhooks, workloads
from gpupool.service.routes import config as config_area
from gpupool.service.routes import cost as cost_area
from gpupool.service.routes import history as history_area
from gpupool.service.routes import logs as logs_area
from gpupool.service.routes import onboard as onboard_area
from gpupool.service.routes import revisions as revisions_area
from gpupool.service.routes import utilisation as utilisation_area
from gpupool.service.routes.base import install_errors
from gpupool.service.routes.workloads import workload_view
from gpupool.service.utilisation_loop import RULE as HELD_IDLE
from gpupool.service.utilisation_loop import UtilisationLoop
from gpupool.store import TERMINAL_PHASES, Store

#: the areas in the order their routes are matched (and listed in the OpenAPI document)
AREAS = (
    health,
    tokens,
    config_area,
    workloads,
    approvals,
    cluster,
    catalog,
    audit,
    webhooks,
    logs_area,
    cost_area,
    history_area,
    revisions_area,
    onboard_area,
    alerts_area,
    utilisation_area,
)


def create_app(
    config: ServiceConfig | None = None,
    *,
    store: Store | None = None,
    backend: Backend | None = None,
    start_controller: bool = True,
) -> FastAPI:
    """The FastAPI application; the store, backend and controller start with it (lifespan)."""
    cfg = config or ServiceConfig()
    if backend is None and cfg.backend == "kubernetes":
        # its runtime (caches, Lease, source, status writer) needs more than these options
        raise ValueError(
            "the kubernetes backend is assembled by gpupool.kube.wiring (gpupool serve --backend "
            "kubernetes); pass the backend to create_app"
        )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        st, ctl, batcher = _start_service(app, cfg, store, backend, start_controller)
        # GPU utilisation sampled in the background, leader only (gpupool.service.utilisation_loop)
        util = app.state.utilisation = UtilisationLoop(app.state.svc, cfg.utilisation)
        util.start()
        # alerts evaluated in the background, leader only (gpupool.service.alerts)
        rules = {**RULES, HELD_IDLE: util.rule}
        # incidents' changes sent to sinks by workers of their own (gpupool.service.notify)
        notifier = app.state.notifier = start_notifier(app.state.svc, cfg.notifications)
        told = notifier.notify if notifier is not None else None
        app.state.alerts = AlertLoop(
            app.state.svc, interval_s=cfg.alerts_interval_s, rules=rules, on_change=told
        )
        app.state.alerts.start()
        # signed audit checkpoints, leader only (gpupool.service.audit_witness)
        witness = app.state.audit_witness = _start_witness(app.state.svc, cfg)
        try:
            yield
        finally:
            if witness is not None:  # the shutdown checkpoint, while this replica still leads
                witness.stop()
            app.state.alerts.stop()
            if notifier is not None:
                notifier.stop()
            util.stop()
            batcher.close()
            if app.state.svc.leader is not None:
                app.state.svc.leader.stop()
            ctl.stop()
            if store is None:
                st.close()

    app = FastAPI(
        title="gpupool",
        version="0.1.0",
        description="GPU compute scheduling platform: pools, queues, workloads, approvals, audit.",
        lifespan=lifespan,
        docs_url=None,  # /docs and /redoc are served from the package (gpupool.web), not a CDN
        redoc_url=None,
    )
    install_errors(app)
    install_standby_guard(app)
    app.add_middleware(RequestGuard, max_body=cfg.max_body_bytes, max_depth=cfg.max_json_depth)
    app.add_middleware(StrictTransport)  # outermost: the guard's own answers carry it too
    for area in AREAS:
        _add_routes(app, area.router)
    _submit_first(app)
    from gpupool.web import mount as mount_web

    mount_web(app)
    oa.install_bearer(app)
    return app


def _start_service(
    app: FastAPI,
    cfg: ServiceConfig,
    store: Store | None,
    backend: Backend | None,
    start_controller: bool,
) -> tuple[Store, Controller, SubmitBatcher]:
    """Open the store, backend and controller, publish them as ``app.state.svc`` and start the
    controller (under the leader lease, or recovered once when it is not to run); returns what
    the lifespan stops at shutdown."""
    # The scheduling cycle is pure Python and holds the GIL while it runs; hand the
    # request threads the interpreter every millisecond rather than every 5 (CPython's
    # default) so a long cycle delays an API answer by ~1 ms slices, not 5 ms ones.
    sys.setswitchinterval(0.001)
    st = store or Store.open(cfg.url)
    seed_config(st, cfg.config_dir)
    token = st.ensure_bootstrap_admin()
    if token is not None and cfg.write_token_file:
        write_token_file(cfg.token_file, token)
    be = backend or make_builtin_backend(
        cfg.backend,
        state_file=cfg.backend_state_file,
        time_scale=cfg.time_scale,
        failure_rates=cfg.failure_rates,
        node_mtbf_s=cfg.node_mtbf_s,
        node_repair_s=cfg.node_repair_s,
    )
    metrics = Metrics()
    ctl = Controller(st, be, tick_s=cfg.tick_s, min_interval_s=cfg.min_interval_s, hooks=metrics.hooks())
    ctl.faults.backoff_s, ctl.faults.max_backoff_s = cfg.retry_backoff_s, cfg.retry_max_backoff_s
    batcher = SubmitBatcher(st)
    app.state.svc = Service(cfg, st, be, ctl, metrics, batcher, token)
    if app.state.svc.oidc is not None:  # the OIDC groups teams were onboarded with (gpupool.oidc)
        app.state.svc.oidc.use_grants(st.oidc_group_grants)
    metrics.bind(app.state.svc.read, ctl)  # per-queue state, refreshed after cycles
    if (bind := capability(be, Capability.BIND)) is not None:  # the local backend's device health
        bind(app.state.svc)
    if start_controller:
        start_leader(app.state.svc)  # the controller runs only while this replica holds the lease
    else:
        ctl.recover()
    # Why: a full (oldest-generation) collection walks every object the process holds —
    # the libraries, the configuration, the engine's indexes — and stops every request for
    # tens of milliseconds; under a submit burst those stalls were the whole p99 (bench
    # burst: 120-160 ms with, 36-49 ms without). What exists once the service is up lives
    # as long as the process, so it is moved out of the collector's sight (gc.freeze);
    # everything created later is collected as usual.
    gc.collect()
    gc.freeze()
    return st, ctl, batcher


def _start_witness(svc: Service, cfg: ServiceConfig) -> AuditWitness | None:
    """The audit witness, taking checkpoints only while this replica leads (or runs alone)."""
    settings = cfg.audit_witness
    if settings is not None:
        settings = replace(settings, retry_s=cfg.lease_retry_s)

    def leads() -> bool:
        return svc.leader is None or svc.leader.is_leader

    return start_witness(svc.store, settings, server=cfg.leader_url, is_leader=leads)


def _submit_first(app: FastAPI) -> None:
    """Route matching is a linear scan: put the hot path (submit) first."""
    routes = app.router.routes
    hot = [
        r
        for r in routes
        if isinstance(r, Route) and r.path == "/v1/workloads" and "POST" in (r.methods or ())
    ]
    app.router.routes[:] = hot + [r for r in routes if r not in hot]


def _add_routes(app: FastAPI, router: APIRouter) -> None:
    """Declare an area's routes on the application itself, as ``@app.get`` would.

    Why not ``app.include_router``: this FastAPI keeps an included router as one nested entry,
    while route matching, the submit route moved first and the 405 answer's Allow header
    (``openapi.allowed_methods``) all walk the application's one flat list; and a route made
    here takes the application's settings (dependency overrides, strict content type)."""
    for r in router.routes:
        assert isinstance(r, APIRoute), r
        app.router.add_api_route(
            r.path,
            r.endpoint,
            response_model=r.response_model,
            status_code=r.status_code,
            tags=r.tags,
            dependencies=r.dependencies,
            summary=r.summary,
            description=r.description,
            response_description=r.response_description,
            responses=r.responses,
            deprecated=r.deprecated,
            methods=r.methods,
            operation_id=r.operation_id,
            response_model_include=r.response_model_include,
            response_model_exclude=r.response_model_exclude,
            response_model_by_alias=r.response_model_by_alias,
            response_model_exclude_unset=r.response_model_exclude_unset,
            response_model_exclude_defaults=r.response_model_exclude_defaults,
            response_model_exclude_none=r.response_model_exclude_none,
            include_in_schema=r.include_in_schema,
            response_class=r.response_class,
            name=r.name,
            callbacks=r.callbacks,
            openapi_extra=r.openapi_extra,
        )


__all__ = ["TERMINAL_PHASES", "ApiError", "Service", "create_app", "workload_view"]
