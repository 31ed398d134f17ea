"""Notifications: incidents' changes sent to people outside the dashboard — a webhook, an
Alertmanager, e-mail — routed per alert, retried, and each delivery recorded on its incident.

Parts: ``config`` (the NotificationConfig file), ``notice`` (what is sent, in each sink's
form), ``sinks`` (how it is sent), ``dispatch`` (routing, the workers, retries, the record)."""

from gpupool.service.notify.config import (
    NotificationConfigError,
    NotificationSpec,
    config_path,
    load_config,
    parse_config,
)
from gpupool.service.notify.dispatch import Notifier, Router
from gpupool.service.notify.notice import Notice

__all__ = [
    "Notice",
    "NotificationConfigError",
    "NotificationSpec",
    "Notifier",
    "Router",
    "config_path",
    "load_config",
    "parse_config",
]
