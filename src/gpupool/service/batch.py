"""Group commit for submissions: concurrent submits share one transaction.

Why: a submit is acknowledged only once its row, its event and its hash-chained audit record
are committed. The audit chain serialises every append on one anchor row, so one transaction
per submit caps throughput at one commit per submit. Batching whatever arrived while the
previous batch was committing keeps every acknowledgement durable and ordered, while the cost
of a commit is shared by the whole batch. The writing itself is ``Store.submit_workloads``
(same semantics as ``Store.submit_workload``: idempotent by name, Conflict on a different
manifest or owner, per item); this module only queues, batches and resolves the futures.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from gpupool.audit import AuditEntry
from gpupool.store import Store, WorkloadRecord, WorkloadSubmission, check_submission

log = logging.getLogger("gpupool.batch")

Result = tuple[WorkloadRecord, bool]


class SubmitBatcher:
    """One writer thread; callers get a Future resolved when their submit is durable."""

    def __init__(self, store: Store, max_batch: int = 512) -> None:
        self.store = store
        self.max_batch = max_batch
        self._items: deque[tuple[WorkloadSubmission, Future[Result]]] = deque()
        self._cv = threading.Condition()
        self._stop = False
        self.batches = 0
        self.items = 0
        self._thread = threading.Thread(target=self._run, name="gpupool-submit-batcher", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Finish what is queued, then stop the writer."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(10)

    def submit(
        self,
        manifest: Mapping[str, Any],
        *,
        owner: str,
        phase: str,
        audit: AuditEntry,
        resolved_class: str | None = None,
    ) -> Future[Result]:
        """Validate now (raises StoreError), commit with the next batch (the Future);
        ``resolved_class``: the class the task type gave (see ``check_submission``)."""
        sub = check_submission(manifest, owner=owner, phase=phase, audit=audit, resolved_class=resolved_class)
        fut: Future[Result] = Future()
        with self._cv:
            if self._stop:
                raise RuntimeError("the server is shutting down")
            self._items.append((sub, fut))
            self._cv.notify()
        return fut

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._items and not self._stop:
                    self._cv.wait()
                if not self._items and self._stop:
                    return
                batch = [self._items.popleft() for _ in range(min(len(self._items), self.max_batch))]
            try:
                results: list[Any] = self.store.submit_workloads([sub for sub, _ in batch])
            except Exception as exc:  # the database is unreachable: every caller gets the error
                log.warning("batched submit failed", exc_info=True)
                results = [exc] * len(batch)
            self.batches += 1
            self.items += len(batch)
            for (_, fut), res in zip(batch, results, strict=True):
                if isinstance(res, BaseException):
                    fut.set_exception(res)
                else:
                    fut.set_result(res)
