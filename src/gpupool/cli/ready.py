"""``gpupool wait-ready`` and ``gpupool kube wait``: block until a server started in the
background answers, so a quick-start pasted as one block does not race the servers it starts.

Why commands and not sleeps: a fixed sleep is too short on a loaded laptop and wasted on a fast
one; these poll the real readiness (``/readyz``; the API server's ``/version``) to a deadline
and say what they waited for when it passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import typer
import yaml

from gpupool.cli.client.http import ServerOpt

TimeoutOpt = typer.Option(180.0, "--timeout", min=0.1, help="seconds to wait before giving up")


def poll(probe: Callable[[], str | None], timeout: float, what: str) -> None:
    """Call ``probe`` (None when ready, else why not) until it is ready or ``timeout`` passes."""
    end = time.monotonic() + timeout
    why = "not tried"
    while True:
        got = probe()
        if got is None:
            return
        why = got
        if time.monotonic() >= end:
            typer.echo(f"error: {what} not ready after {timeout:g}s: {why}", err=True)
            raise typer.Exit(1)
        time.sleep(0.2)


def _get(url: str) -> str | None:
    try:
        r = httpx.get(url, timeout=2.0, verify=False)  # the fake serves plain HTTP; a real one any cert
    except httpx.HTTPError as exc:
        return f"{url}: {type(exc).__name__}"
    return None if r.status_code < 500 else f"{url}: HTTP {r.status_code}"


def wait_ready(server: str | None = ServerOpt, timeout: float = TimeoutOpt) -> None:
    """Wait until gpupool serve answers /readyz (store, controller and backend ready)."""
    from gpupool.cli.client.http import config_file, resolve, server_verify

    base, _ = resolve(server, None)
    verify = server_verify(config_file())  # an https server is checked as every command checks it

    def probe() -> str | None:
        try:
            r = httpx.get(base + "/readyz", timeout=2.0, verify=verify)
        except httpx.HTTPError as exc:
            return f"{base}: {type(exc).__name__}"
        return None if r.status_code == 200 else f"{base}/readyz: HTTP {r.status_code} {r.text[:200]}"

    poll(probe, timeout, f"gpupool at {base}")
    typer.echo(f"gpupool at {base} is ready")


def kubeconfig_server(path: Path) -> str | None:
    """The current context's API server URL in ``path`` (None while the file is absent or partial)."""
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        ctx = next(c for c in cfg["contexts"] if c["name"] == cfg["current-context"])["context"]
        return str(next(c for c in cfg["clusters"] if c["name"] == ctx["cluster"])["cluster"]["server"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, StopIteration):
        return None


def kube_wait(
    kubeconfig: Path = typer.Option(
        Path(".gpupool/fake-kubeconfig"), "--kubeconfig", help="kubeconfig to wait for"
    ),
    timeout: float = TimeoutOpt,
) -> None:
    """Wait until KUBECONFIG exists and its API server answers (after `gpupool kube fake &`)."""

    def probe() -> str | None:
        url = kubeconfig_server(kubeconfig)
        return f"{kubeconfig}: no kubeconfig yet" if url is None else _get(url.rstrip("/") + "/version")

    poll(probe, timeout, f"the API server of {kubeconfig}")
    typer.echo(f"API server of {kubeconfig} is ready")


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """``gpupool wait-ready``."""
    app.command("wait-ready")(wait_ready)
