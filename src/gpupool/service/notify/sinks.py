"""The sinks: each sends one Notice and raises on failure (the dispatcher retries).

Why one small class per destination with one method: the retry, the queue and the record are
the dispatcher's, so a new destination is a new ``send`` and nothing else. HTTP goes through
httpx (a non-2xx answer is a failure that names the status), e-mail through the standard
library's smtplib."""

from __future__ import annotations

import os
import smtplib
import ssl
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import httpx

from gpupool.service.notify.config import AlertmanagerSpec, EmailSpec, NotificationSpec, SinkSpec, WebhookSpec
from gpupool.service.notify.notice import Notice, alertmanager_alert, email_message, webhook_body

Clock = Callable[[], datetime]


def _now() -> datetime:
    return datetime.now(UTC)


class Sink(Protocol):
    name: str
    #: seconds between posts of the kept open incidents (``resend``); None: the sink never
    #: resends (only Alertmanager forgets an alert that is not posted again)
    resend_interval_s: float | None

    def send(self, notice: Notice) -> None:
        """Deliver or raise (the message says why)."""

    def keep(self, notice: Notice) -> None:
        """Remember an open incident for ``resend`` (a sink that never resends ignores it)."""

    def resend(self) -> int:
        """Post every kept open incident again: how many (0 for a sink that never resends)."""

    def close(self) -> None: ...


def secret(env: str | None, file: Path | None) -> str | None:
    """The secret named by an environment variable or a file (read now: a rotated file needs no
    restart), or None when neither is given."""
    if env is not None:
        return os.environ.get(env) or None
    if file is not None:
        return file.read_text(encoding="utf-8").strip()
    return None


def _check(resp: httpx.Response) -> None:
    if resp.status_code >= 300:
        raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")


class _HttpSink:
    def __init__(self, name: str, spec: WebhookSpec | AlertmanagerSpec, timeout_s: float) -> None:
        self.name = name
        self.spec = spec
        self.client = httpx.Client(timeout=timeout_s, follow_redirects=False)

    def _headers(self) -> dict[str, str]:
        token = secret(self.spec.bearerTokenEnv, self.spec.bearerTokenFile)
        return {"Authorization": f"Bearer {token}"} if token else {}

    def close(self) -> None:
        self.client.close()


class WebhookSink(_HttpSink):
    """POST the webhook's JSON to ``url``."""

    resend_interval_s: float | None = None

    def __init__(
        self, name: str, spec: WebhookSpec, timeout_s: float, external: str | None, clock: Clock
    ) -> None:
        super().__init__(name, spec, timeout_s)
        self.webhook, self.external, self.clock = spec, external, clock

    def send(self, notice: Notice) -> None:
        body = webhook_body(notice, self.external, self.clock())
        headers = {**self.webhook.headers, **self._headers()}
        _check(self.client.post(self.webhook.url, json=body, headers=headers))

    def keep(self, notice: Notice) -> None:
        pass

    def resend(self) -> int:
        return 0


class AlertmanagerSink(_HttpSink):
    """POST ``[alert]`` to ``url/api/v2/alerts``; keeps the open incidents it sent, which
    :meth:`resend` posts again (Alertmanager forgets an alert past its ``endsAt``)."""

    def __init__(
        self, name: str, spec: AlertmanagerSpec, timeout_s: float, external: str | None, clock: Clock
    ) -> None:
        super().__init__(name, spec, timeout_s)
        self.am, self.external, self.clock = spec, external, clock
        self.resend_interval_s: float | None = spec.resendInterval
        self.open: dict[int, Notice] = {}
        self._mu = threading.Lock()

    def _post(self, notices: list[Notice]) -> None:
        now = self.clock()
        body = [alertmanager_alert(n, self.external, now, self.am.resendInterval) for n in notices]
        _check(self.client.post(f"{self.am.url}/api/v2/alerts", json=body, headers=self._headers()))

    def send(self, notice: Notice) -> None:
        self._post([notice])
        self.keep(notice)

    def keep(self, notice: Notice) -> None:
        """Post ``notice`` again at each resend while its incident is open."""
        with self._mu:
            if notice.state == "resolved":
                self.open.pop(notice.id, None)
            else:
                self.open[notice.id] = notice

    def resend(self) -> int:
        """Post every open incident again: how many."""
        with self._mu:
            notices = list(self.open.values())
        if notices:
            self._post(notices)
        return len(notices)


class EmailSink:
    """One message per notice through ``host:port``, STARTTLS when asked (the certificate and
    host name verified), logged in when a username is given."""

    resend_interval_s: float | None = None

    def __init__(self, name: str, spec: EmailSpec, timeout_s: float, external: str | None) -> None:
        self.name, self.spec, self.timeout_s, self.external = name, spec, timeout_s, external

    def send(self, notice: Notice) -> None:
        s = self.spec
        msg = email_message(notice, self.external, s.sender, s.to)
        with smtplib.SMTP(s.host, s.port, timeout=self.timeout_s) as smtp:
            if s.startTLS:  # verified: smtplib's own default context checks no certificate
                cafile = str(s.caFile) if s.caFile is not None else None
                smtp.starttls(context=ssl.create_default_context(cafile=cafile))
            if s.username:
                smtp.login(s.username, secret(s.passwordEnv, s.passwordFile) or "")
            smtp.send_message(msg)

    def keep(self, notice: Notice) -> None:
        pass

    def resend(self) -> int:
        return 0

    def close(self) -> None:
        pass


def build_sink(s: SinkSpec, spec: NotificationSpec, clock: Clock = _now) -> Sink:
    """The sink a SinkSpec declares."""
    t, ext = spec.retry.timeout, spec.externalURL
    if s.webhook is not None:
        return WebhookSink(s.name, s.webhook, t, ext, clock)
    if s.alertmanager is not None:
        return AlertmanagerSink(s.name, s.alertmanager, t, ext, clock)
    assert s.email is not None  # the config's checks: exactly one kind
    return EmailSink(s.name, s.email, t, ext)


__all__ = ["AlertmanagerSink", "EmailSink", "Sink", "WebhookSink", "build_sink", "secret"]
