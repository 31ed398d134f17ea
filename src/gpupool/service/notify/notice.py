"""What is sent: one change of an incident (a Notice) and its three renderings — the webhook's
JSON, Alertmanager's alert and an e-mail.

Why one Notice for all sinks: every sink says the same thing (alert, severity, state, labels,
summary, link, times), so a receiver reading two of them never sees two stories."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from email.message import EmailMessage
from typing import Any

#: the subject's kinds that become labels (``queue/x`` -> ``queue=x``; ``node/n/gpu/0`` -> both)
LABEL_KINDS = ("queue", "pool", "workload", "node", "gpu")


def subject_labels(subject: str) -> dict[str, str]:
    """An incident's subject as labels: ``node/n1/gpu/3`` -> ``{"node": "n1", "gpu": "3"}``.
    Pairs of an unknown kind are kept as they are written, so nothing is lost."""
    parts = subject.split("/")
    out: dict[str, str] = {}
    for i in range(0, len(parts) - 1, 2):
        out[parts[i] if parts[i] in LABEL_KINDS else f"subject_{parts[i]}"] = parts[i + 1]
    return out


@dataclass(frozen=True, slots=True)
class Notice:
    """An incident as it is after a change, and which change: ``firing`` (opened),
    ``acknowledged`` or ``resolved``."""

    incident: dict[str, Any]
    state: str

    @property
    def id(self) -> int:
        return int(self.incident["id"])

    @property
    def labels(self) -> dict[str, str]:
        i = self.incident
        return {"alertname": i["rule"], "severity": i["severity"], **subject_labels(i["subject"])}


def link(external_url: str | None, notice: Notice) -> str:
    """Where a person sees the incident: the dashboard's incidents page ('' without a URL)."""
    return f"{external_url}/#/incidents" if external_url else ""


def webhook_body(notice: Notice, external_url: str | None, sent_at: datetime) -> dict[str, Any]:
    """The webhook's JSON (version 1): the alert, its state and labels, the summary, a link and
    the incident's times."""
    i = notice.incident
    return {
        "version": "1",
        "alert": i["rule"],
        "severity": i["severity"],
        "state": notice.state,
        "incident": notice.id,
        "subject": i["subject"],
        "labels": notice.labels,
        "summary": i["message"],
        "link": link(external_url, notice),
        "firedAt": i["firedAt"],
        "acknowledgedAt": i["acknowledgedAt"],
        "acknowledgedBy": i["acknowledgedBy"],
        "owner": i["owner"],
        "resolvedAt": i["resolvedAt"],
        "resolvedBy": i["resolvedBy"],
        "resolution": i["resolution"],
        "sentAt": sent_at.isoformat(),
    }


def alertmanager_alert(
    notice: Notice, external_url: str | None, sent_at: datetime, resend_s: float
) -> dict[str, Any]:
    """One alert of Alertmanager's ``POST /api/v2/alerts`` body. An open incident's ``endsAt``
    is four resend intervals ahead (Prometheus' rule), a resolved one's is when it resolved;
    an acknowledgement is an annotation (Alertmanager's own acknowledgement is a silence)."""
    i = notice.incident
    annotations = {"summary": i["message"], "incident": str(notice.id)}
    if i["owner"]:
        annotations["owner"] = i["owner"]
    if i["acknowledgedBy"]:
        annotations["acknowledgedBy"] = i["acknowledgedBy"]
    if i["resolution"]:
        annotations["resolution"] = i["resolution"]
    ends = i["resolvedAt"] if notice.state == "resolved" and i["resolvedAt"] else None
    return {
        "labels": notice.labels,
        "annotations": annotations,
        "startsAt": i["firedAt"],
        "endsAt": ends or (sent_at + timedelta(seconds=4 * resend_s)).isoformat(),
        "generatorURL": link(external_url, notice),
    }


def email_message(notice: Notice, external_url: str | None, sender: str, to: list[str]) -> EmailMessage:
    """A plain-text message; the subject line says state, severity, alert and subject."""
    i = notice.incident
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = ", ".join(to)
    msg["Subject"] = f"[gpupool] {notice.state.upper()} {i['severity']} {i['rule']} {i['subject']}"
    lines = [
        f"{i['rule']} on {i['subject']} is {notice.state} (severity {i['severity']}).",
        "",
        i["message"],
        "",
        f"incident:   {notice.id}",
        f"fired at:   {i['firedAt']}",
    ]
    if i["acknowledgedAt"]:
        lines.append(f"taken by:   {i['owner'] or i['acknowledgedBy']} at {i['acknowledgedAt']}")
    if i["resolvedAt"]:
        lines.append(f"resolved:   {i['resolvedAt']} by {i['resolvedBy']}: {i['resolution']}")
    lines += [f"labels:     {', '.join(f'{k}={v}' for k, v in notice.labels.items())}"]
    if external_url:
        lines.append(f"dashboard:  {link(external_url, notice)}")
    msg.set_content("\n".join(lines) + "\n")
    return msg


__all__ = ["Notice", "alertmanager_alert", "email_message", "link", "subject_labels", "webhook_body"]
