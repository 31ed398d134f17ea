"""Who gets told, and the trying: the router picks the sinks of an incident (first matching
route, else the default), and one worker per sink delivers with retries, recording each
delivery on the incident.

Why a worker (a thread and a bounded queue) per sink: whoever reports a change — the alert
loop, an acknowledgement over the API — only records the delivery as pending and enqueues it,
so a slow or dead sink never holds up the controller, the alert evaluation or another sink. A
full queue drops the delivery, recorded as ``dropped``: nothing waits for a sink's room."""

from __future__ import annotations

import fnmatch
import logging
import queue
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter

from gpupool.service.notify.config import NotificationSpec, RetrySpec, RouteSpec
from gpupool.service.notify.notice import Notice, subject_labels
from gpupool.service.notify.sinks import Sink, build_sink

log = logging.getLogger("gpupool.notify")

#: an incident's state as the store keeps it -> the change a notice reports
CHANGES = {"Firing": "firing", "Acknowledged": "acknowledged", "Resolved": "resolved"}


class DeliveryLog(Protocol):
    """Where deliveries are recorded (the store: gpupool.store.incidents)."""

    def open_delivery(self, incident: int, sink: str, state: str) -> int: ...

    def update_delivery(self, delivery: int, *, attempts: int, outcome: str, error: str) -> None: ...


def _matches(route: RouteSpec, incident: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    m = route.match
    wanted = (("queue", m.queue), ("pool", m.pool), ("rule", m.rule))
    values = {"queue": labels.get("queue"), "pool": labels.get("pool"), "rule": incident["rule"]}
    for key, patterns in wanted:
        v = values[key]
        if patterns and (v is None or not any(fnmatch.fnmatchcase(v, p) for p in patterns)):
            return False
    return not m.severity or incident["severity"] in m.severity


class Router:
    """The sinks of an incident: those of the first route that matches it, else the default."""

    def __init__(self, routes: Iterable[RouteSpec], default: Iterable[str]) -> None:
        self.routes = list(routes)
        self.default = list(default)

    def sinks_for(self, incident: Mapping[str, Any]) -> list[str]:
        labels = subject_labels(incident["subject"])
        for r in self.routes:
            if _matches(r, incident, labels):
                return list(r.sinks)
        return list(self.default)


@dataclass(frozen=True, slots=True)
class Job:
    notice: Notice
    delivery: int


class SinkWorker:
    """Delivers one sink's jobs in order, each up to ``retry.attempts`` times with a doubling
    wait between, and records every attempt; an Alertmanager sink's open incidents are posted
    again every ``resendInterval`` while the worker is idle."""

    def __init__(
        self, sink: Sink, retry: RetrySpec, record: DeliveryLog, queue_size: int, counter: PromCounter
    ) -> None:
        self.sink, self.retry, self.record, self.counter = sink, retry, record, counter
        self.q: queue.Queue[Job] = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.resend_s: float | None = sink.resend_interval_s

    def offer(self, job: Job) -> bool:
        """Enqueue without waiting; False when the queue is full."""
        try:
            self.q.put_nowait(job)
        except queue.Full:
            return False
        return True

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"gpupool-notify-{self.sink.name}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.sink.close()

    def remember(self, open_incidents: Iterable[dict[str, Any]]) -> None:
        """The incidents open now, for a sink that keeps posting open alerts (Alertmanager)."""
        if self.resend_s is None:
            return  # a sink that never resends keeps nothing
        for inc in open_incidents:
            self.sink.keep(Notice(inc, CHANGES[inc["state"]]))

    def _run(self) -> None:
        last_resend = time.monotonic()
        while not self._stop.is_set():
            wait = 0.5 if self.resend_s is None else min(0.5, self.resend_s)
            try:
                job: Job | None = self.q.get(timeout=wait)
            except queue.Empty:
                job = None
            if job is not None:
                self.deliver(job)
            # due resends go out between deliveries too: a busy sink must not let alerts expire
            if self.resend_s is not None and time.monotonic() - last_resend >= self.resend_s:
                last_resend = time.monotonic()
                self._resend()

    def _resend(self) -> None:
        try:
            self.sink.resend()
        except Exception as exc:  # the next interval tries again; the deliveries stand as recorded
            log.warning("notification sink %s: resending open alerts failed: %s", self.sink.name, exc)

    def deliver(self, job: Job) -> None:
        """Try, wait, try again; the delivery's record says how it went after every attempt."""
        delay, error = self.retry.backoff, ""
        for attempt in range(1, self.retry.attempts + 1):
            try:
                self.sink.send(job.notice)
            except Exception as exc:  # any failure of a sink is its own, never the worker's
                error = f"{type(exc).__name__}: {exc}"[:2000]
                last = attempt == self.retry.attempts
                self.note(job, attempt, "failed" if last else "retrying", error)
                if last or self._stop.wait(delay):
                    return
                delay = min(delay * 2, self.retry.maxBackoff)
            else:
                self.note(job, attempt, "delivered", error)
                return

    def note(self, job: Job, attempts: int, outcome: str, error: str) -> None:
        """Count, log and record how a delivery stands (a failure to record is logged only)."""
        self.counter.labels(self.sink.name, outcome).inc()
        if outcome != "retrying":
            level = logging.INFO if outcome == "delivered" else logging.WARNING
            what = (job.notice.id, self.sink.name, outcome, attempts, error)
            log.log(level, "incident %s to %s: %s after %d attempt(s) %s", *what)
        try:
            self.record.update_delivery(job.delivery, attempts=attempts, outcome=outcome, error=error)
        except Exception as exc:  # the database away (or this replica deposed): the send stands
            log.warning("cannot record delivery %s: %s", job.delivery, exc)


class Notifier:
    """Routes each change of an incident to its sinks' workers and records each delivery."""

    def __init__(
        self,
        spec: NotificationSpec,
        record: DeliveryLog,
        *,
        sinks: Mapping[str, Sink] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.spec = spec
        self.record = record
        self.router = Router(spec.routes, spec.default)
        built = dict(sinks) if sinks is not None else {s.name: build_sink(s, spec) for s in spec.sinks}
        reg = registry if registry is not None else CollectorRegistry()
        self.counter = PromCounter(
            "gpupool_notifications",
            "Notification attempts by sink and outcome",
            ["sink", "outcome"],
            registry=reg,
        )
        self.workers = {
            n: SinkWorker(s, spec.retry, record, spec.queueSize, self.counter) for n, s in built.items()
        }

    def start(self, open_incidents: Iterable[dict[str, Any]] = ()) -> None:
        """Start the workers; ``open_incidents`` (those open at start) are what Alertmanager
        sinks keep posting until they resolve."""
        open_now = list(open_incidents)
        for w in self.workers.values():
            w.remember(open_now)
            w.start()

    def stop(self) -> None:
        for w in self.workers.values():
            w.stop()

    def notify(self, incident: dict[str, Any]) -> None:
        """``incident`` (as stored, after its change) to each sink its route names; returns at
        once. Deliveries are recorded ``pending`` first, ``dropped`` when a queue is full."""
        change = CHANGES.get(incident["state"])
        if change is None or change not in self.spec.states:
            return
        notice = Notice(incident, change)
        for name in self.router.sinks_for(incident):
            try:
                delivery = self.record.open_delivery(notice.id, name, change)
            except Exception as exc:  # not recorded, not sent: a deposed leader's change
                log.warning("cannot record a delivery of incident %s to %s: %s", notice.id, name, exc)
                continue
            if not self.workers[name].offer(Job(notice, delivery)):
                self.workers[name].note(
                    Job(notice, delivery), 0, "dropped", f"the sink's queue is full ({self.spec.queueSize})"
                )


def start_notifier(svc: Any, spec: NotificationSpec | None) -> Notifier | None:
    """The server's notifier (None without a configuration), started, its deliveries written
    through the controller's store (fenced while this replica leads, like the incidents), the
    incidents open now kept posted to Alertmanager sinks."""
    if spec is None:
        return None
    notifier = Notifier(spec, svc.controller.store, registry=svc.metrics.registry)
    try:
        open_now = svc.store.list_incidents(open_only=True)
    except Exception as exc:  # the database away at start: sinks learn of incidents as they change
        log.warning("cannot read the open incidents: %s", exc)
        open_now = []
    notifier.start(open_now)
    return notifier


__all__ = ["CHANGES", "DeliveryLog", "Job", "Notifier", "Router", "SinkWorker", "start_notifier"]
