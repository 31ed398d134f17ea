"""The backends the service builds from its own options: ``virtual`` and ``local``.

Why a module of its own rather than ``backends/__init__``: the backends import the port
(``gpupool.service.backends``); were the port to import them back to build them, the package
and its backends would be one import circle. The Kubernetes backend needs a connection and a
runtime of its own; any kind, Kubernetes included, is built by ``gpupool.composition``.
"""

from __future__ import annotations

from typing import Any

from gpupool.service.backends import Backend

BUILTIN_KINDS = ("virtual", "local")


def make_builtin_backend(kind: str, **options: Any) -> Backend:
    """Backend by name: ``virtual`` (simulated nodes) or ``local`` (processes on this host)."""
    if kind == "virtual":
        from gpupool.service.backends.virtual import VirtualBackend

        return VirtualBackend(**options)
    if kind == "local":
        from gpupool.service.backends.local import LocalBackend

        return LocalBackend(**options)
    raise ValueError(f"unknown backend {kind!r}; available: {', '.join(BUILTIN_KINDS)}")
