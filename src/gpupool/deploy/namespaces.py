"""The queue a namespace's ``gpupool.io/queue`` label names, for the mutating webhook.

Why the webhook asks: an AdmissionReview carries the object, not its namespace's labels, and
the backend reads an object's queue from the object. So the webhook copies the namespace's
queue onto objects that name none. Answers are kept ``ttl_s`` seconds (a burst of pods in one
namespace costs one GET); a failed lookup answers None, never an error: the object is still
mutated, and the backend's ``--namespace-queue`` default (or its refusal Event) applies.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpupool.kube.client import ApiError, KubeApi, Resource
from gpupool.manifests.mutate import QUEUE_LABEL

NAMESPACES = Resource("", "v1", "namespaces", "Namespace", False)
log = logging.getLogger("gpupool.deploy.namespaces")


class NamespaceQueues:
    """``namespace -> queue or None`` with a short cache (thread-safe: uvicorn's worker threads)."""

    def __init__(
        self, api: KubeApi, ttl_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.api, self.ttl_s, self.clock = api, ttl_s, clock
        self._cache: dict[str, tuple[float, str | None]] = {}
        self._lock = threading.Lock()

    def __call__(self, namespace: str) -> str | None:
        now = self.clock()
        with self._lock:
            hit = self._cache.get(namespace)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        try:
            labels = (self.api.get(NAMESPACES, None, namespace).get("metadata") or {}).get("labels") or {}
            queue = labels.get(QUEUE_LABEL) or None
        except ApiError as exc:
            log.warning("namespace %s: cannot read its labels (%s)", namespace, exc)
            return None
        with self._lock:
            self._cache[namespace] = (now, queue)
        return queue
