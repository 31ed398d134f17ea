"""The composition root: the one place that builds a backend of any kind.

Why at the top of the package order (above the service and the Kubernetes adapter): the
service defines the backend port and builds its own backends (``virtual``, ``local``:
``gpupool.service.backends.builtin``); the Kubernetes backend implements that port from above
(``gpupool.kube.adapters.backend``). A factory that knows every kind must see both, so it sits
above both, and nothing lower imports it: the service never reaches up into ``kube`` to build one.
"""

from __future__ import annotations

from typing import Any

from gpupool.service.backends import Backend
from gpupool.service.backends.builtin import BUILTIN_KINDS, make_builtin_backend

KINDS = (*BUILTIN_KINDS, "kubernetes")


def make_backend(kind: str, **options: Any) -> Backend:
    """Backend by name: ``virtual``, ``local`` or ``kubernetes`` (``kubeconfig=``, ``context=``
    and the KubernetesBackend options; returned with its caches synced)."""
    if kind == "kubernetes":
        from gpupool.kube.adapters.backend import connect

        return connect(**options)
    if kind not in BUILTIN_KINDS:
        raise ValueError(f"unknown backend {kind!r}; available: {', '.join(KINDS)}")
    return make_builtin_backend(kind, **options)
