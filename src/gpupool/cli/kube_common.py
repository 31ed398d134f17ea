"""What the ``gpupool kube`` commands share: a Cluster manifest's documents, and the signals
that stop a server cleanly.

Why a module of its own: ``kube`` (the fake API server) and ``kube_cluster`` (the local
control plane) both use them, and ``kube`` mounts ``kube_cluster``'s commands; here neither
imports the other back.
"""

from __future__ import annotations

import signal
from pathlib import Path

import typer
import yaml


def cluster_docs(path: Path) -> list[dict[str, object]]:
    files = sorted(path.glob("*.yaml")) + sorted(path.glob("*.yml")) if path.is_dir() else [path]
    docs: list[dict[str, object]] = []
    for f in files:
        try:
            docs += [d for d in yaml.safe_load_all(f.read_text()) if isinstance(d, dict)]
        except (OSError, yaml.YAMLError) as exc:
            raise typer.BadParameter(f"{f}: {exc}", param_hint="--cluster") from None
    return docs


def stop_on_signals() -> None:
    """Ctrl-C and SIGTERM stop the server cleanly. Why explicit: a process started with SIGINT
    ignored (``cmd &`` in a script, some test runners) inherits that, and Python then installs
    no KeyboardInterrupt handler, so Ctrl-C did nothing; SIGTERM (``kill``) skipped the cleanup."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
