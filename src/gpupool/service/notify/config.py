"""The NotificationConfig file: where alerts go (sinks), which alert goes where (routes), and how
hard gpupool tries (retry).

Why a file beside the store, like the CostPolicy: sinks carry endpoints and the names of
secrets, which belong to the operator's deployment (a ConfigMap, a mounted Secret), not to the
objects tenants apply. Secrets never sit in the file in clear: a password or bearer token is
named by an environment variable or a file (``passwordEnv``/``passwordFile``), checked when the
file is loaded and read when a message is sent (a rotated file needs no restart).

Example::

    apiVersion: gpupool.io/v1alpha1
    kind: NotificationConfig
    metadata: {name: default}
    spec:
      externalURL: https://gpupool.example.com
      retry: {attempts: 5, backoff: 2s, maxBackoff: 1m, timeout: 10s}
      sinks:
        - name: oncall
          alertmanager: {url: http://alertmanager:9093}
        - name: chat
          webhook: {url: https://chat.example.com/hooks/gpupool}
        - name: mail
          email: {host: smtp.example.com, port: 587, startTLS: true, from: gpupool@example.com,
                  to: [gpu-admins@example.com], username: gpupool, passwordEnv: SMTP_PASSWORD}
      routes:
        - match: {severity: critical}
          sinks: [oncall, mail]
        - match: {queue: "research-*"}
          sinks: [chat]
      default: [chat]
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from gpupool.quantity import parse_duration
from gpupool.service.notify.located import line_of, loc_text

API_VERSION: Final = "gpupool.io/v1alpha1"
KIND: Final = "NotificationConfig"
#: the environment variable that names the file (``gpupool serve --notifications`` overrides it)
FILE_ENV: Final = "GPUPOOL_NOTIFICATIONS"
#: the file read from the state directory when neither the option nor the variable is given
DEFAULT_FILE: Final = "notifications.yaml"
State = Literal["firing", "acknowledged", "resolved"]
STATES: Final[tuple[State, ...]] = ("firing", "acknowledged", "resolved")
SEVERITIES: Final = ("critical", "warning", "info")
#: fields that would hold a secret in clear, and what to write instead
SECRET_FIELDS: Final = {
    "password": "passwordEnv or passwordFile",
    "bearerToken": "bearerTokenEnv or bearerTokenFile",
}


class NotificationConfigError(ValueError):
    """A NotificationConfig that cannot be used; one located line per problem."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("\n".join(errors))


def _seconds(v: object) -> float:
    return parse_duration(v)


Seconds = Annotated[float, BeforeValidator(_seconds)]


def _one_or_many(v: object) -> object:
    """``severity: critical`` is read as ``severity: [critical]``."""
    return [v] if isinstance(v, str) else v


Names = Annotated[list[str], BeforeValidator(_one_or_many)]
Severities = Annotated[list[Literal["critical", "warning", "info"]], BeforeValidator(_one_or_many)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


def _http_url(v: str) -> str:
    if not v.startswith(("http://", "https://")) or len(v) < 10:
        raise ValueError("must be an http:// or https:// URL")
    return v.rstrip("/")


Url = Annotated[str, Field(max_length=2048), AfterValidator(_http_url)]


class _BearerSecret(_Strict):
    """An optional bearer token, named by an environment variable or a file."""

    bearerTokenEnv: str | None = Field(None, min_length=1, max_length=253)
    bearerTokenFile: Path | None = None


class WebhookSpec(_BearerSecret):
    """POST of one JSON document per change of an incident."""

    url: Url
    headers: dict[str, str] = Field(default_factory=dict)


class AlertmanagerSpec(_BearerSecret):
    """Alertmanager's ``POST /api/v2/alerts``; an open incident is sent again every
    ``resendInterval`` (its ``endsAt`` four intervals ahead, as Prometheus does), so
    Alertmanager does not resolve it by its own timeout."""

    url: Url = Field(description="Alertmanager's base URL, e.g. http://am:9093")
    resendInterval: Seconds = Field(60.0, gt=0, le=86400)


class EmailSpec(_Strict):
    """One message per change of an incident, through an SMTP relay."""

    host: str = Field(min_length=1, max_length=253)
    port: int = Field(587, ge=1, le=65535)
    sender: str = Field(alias="from", min_length=3, max_length=253, pattern=r"^[^@\s]+@[^@\s]+$")
    to: list[Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+$", max_length=253)]] = Field(min_length=1)
    startTLS: bool = False
    #: the CA bundle that signs the relay's certificate (default: the system's); STARTTLS
    #: always verifies the certificate and the host name
    caFile: Path | None = None
    username: str | None = Field(None, min_length=1, max_length=253)
    passwordEnv: str | None = Field(None, min_length=1, max_length=253)
    passwordFile: Path | None = None


class SinkSpec(_Strict):
    """A named destination: exactly one of webhook, alertmanager, email."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    webhook: WebhookSpec | None = None
    alertmanager: AlertmanagerSpec | None = None
    email: EmailSpec | None = None

    @property
    def kind(self) -> str:
        return next(k for k in ("webhook", "alertmanager", "email") if getattr(self, k) is not None)


class MatchSpec(_Strict):
    """An alert matches when every field given matches (a list: any of its values; ``*`` and
    ``?`` are wildcards). An alert on a node has no queue or pool: a route asking for one does
    not match it."""

    queue: Names = Field(default_factory=list)
    pool: Names = Field(default_factory=list)
    severity: Severities = Field(default_factory=list)
    rule: Names = Field(default_factory=list)


class RouteSpec(_Strict):
    match: MatchSpec = Field(default_factory=MatchSpec)
    sinks: list[str] = Field(min_length=1)


class RetrySpec(_Strict):
    """Attempts per delivery; the wait after a failed one starts at ``backoff`` and doubles up
    to ``maxBackoff``; each attempt gives up after ``timeout``."""

    attempts: int = Field(5, ge=1, le=100)
    backoff: Seconds = Field(1.0, ge=0, le=86400)
    maxBackoff: Seconds = Field(60.0, ge=0, le=86400)
    timeout: Seconds = Field(10.0, gt=0, le=600)


class NotificationSpec(_Strict):
    externalURL: Url | None = Field(None, description="the dashboard's URL, for links")
    sinks: list[SinkSpec] = Field(min_length=1)
    routes: list[RouteSpec] = Field(default_factory=list)
    #: the sinks of an alert no route matches (empty: such an alert notifies nobody)
    default: list[str] = Field(default_factory=list)
    #: which changes of an incident are sent
    states: list[State] = Field(default_factory=lambda: list(STATES))
    retry: RetrySpec = Field(default_factory=RetrySpec)
    #: deliveries waiting per sink; one more is dropped (and recorded as such), never waited for
    queueSize: int = Field(1000, ge=1, le=100_000)


class NotificationConfig(_Strict):
    apiVersion: Literal["gpupool.io/v1alpha1"]
    kind: Literal["NotificationConfig"]
    metadata: dict[str, Any] = Field(default_factory=lambda: {"name": "default"})
    spec: NotificationSpec


def _pydantic_problems(exc: ValidationError) -> list[tuple[tuple[Any, ...], str]]:
    out = []
    for e in exc.errors():
        loc = tuple(x for x in e["loc"] if not (isinstance(x, str) and x.startswith("function-")))
        if e["type"] == "extra_forbidden" and loc and loc[-1] in SECRET_FIELDS:
            msg = f"a secret is not read from this file; name it with {SECRET_FIELDS[str(loc[-1])]}"
        else:
            msg = str(e["msg"]).removeprefix("Value error, ")
        out.append((loc, msg))
    return out


def _cross_checks(spec: NotificationSpec, environ: Mapping[str, str]) -> list[tuple[tuple[Any, ...], str]]:
    """What one field cannot say alone: sink names unique and known, each sink of one kind,
    secrets present and paired, backoff within its cap."""
    out: list[tuple[tuple[Any, ...], str]] = []
    names = [s.name for s in spec.sinks]
    for i, s in enumerate(spec.sinks):
        if s.name in names[:i]:
            out.append((("spec", "sinks", i, "name"), f"duplicate sink name {s.name!r}"))
        given = [k for k in ("webhook", "alertmanager", "email") if getattr(s, k) is not None]
        if len(given) != 1:
            out.append(
                (
                    ("spec", "sinks", i),
                    f"needs exactly one of webhook, alertmanager, email (got {given or 'none'})",
                )
            )
            continue
        out += _secret_checks(s, ("spec", "sinks", i, s.kind), environ)
    known = ", ".join(names)
    for j, r in enumerate(spec.routes):
        for k, n in enumerate(r.sinks):
            if n not in names:
                out.append((("spec", "routes", j, "sinks", k), f"no sink named {n!r} (sinks: {known})"))
    for k, n in enumerate(spec.default):
        if n not in names:
            out.append((("spec", "default", k), f"no sink named {n!r} (sinks: {known})"))
    if spec.retry.backoff > spec.retry.maxBackoff:
        out.append((("spec", "retry", "backoff"), "must not exceed spec.retry.maxBackoff"))
    return out


def _secret_checks(
    s: SinkSpec, at: tuple[Any, ...], environ: Mapping[str, str]
) -> list[tuple[tuple[Any, ...], str]]:
    sub = getattr(s, s.kind)
    pairs = (
        [("passwordEnv", "passwordFile")] if s.kind == "email" else [("bearerTokenEnv", "bearerTokenFile")]
    )
    out: list[tuple[tuple[Any, ...], str]] = []
    for env_field, file_field in pairs:
        env, file = getattr(sub, env_field), getattr(sub, file_field)
        if env is not None and file is not None:
            out.append(((*at, file_field), f"give {env_field} or {file_field}, not both"))
        if env is not None and not environ.get(env):
            out.append(((*at, env_field), f"the environment variable {env} is not set"))
        if file is not None and not Path(file).is_file():
            out.append(((*at, file_field), f"{file}: no such file"))
    if s.kind == "email" and sub.caFile is not None and not Path(sub.caFile).is_file():
        out.append(((*at, "caFile"), f"{sub.caFile}: no such file"))
    if s.kind == "email" and (sub.username is None) != (sub.passwordEnv is None and sub.passwordFile is None):
        field = "username" if sub.username is None else "passwordEnv"
        out.append(((*at, field), "username and a password (passwordEnv or passwordFile) go together"))
    return out


def parse_config(
    doc: Any, source: str = "<input>", text: str | None = None, environ: Mapping[str, str] | None = None
) -> NotificationSpec:
    """Validate one NotificationConfig document; every problem is one line ``source[ line N]:
    field.path: problem`` (the line where the YAML ``text`` is given)."""
    env = os.environ if environ is None else environ
    if not isinstance(doc, Mapping):
        raise NotificationConfigError([f"{source}: expected one {KIND} document (a mapping)"])
    try:
        spec = NotificationConfig.model_validate(doc).spec
    except ValidationError as exc:
        problems = _pydantic_problems(exc)
    else:
        problems = _cross_checks(spec, env)
    if problems:
        raise NotificationConfigError([_located(source, text, loc, msg) for loc, msg in problems])
    return spec


def _located(source: str, text: str | None, loc: tuple[Any, ...], msg: str) -> str:
    line = line_of(text, loc) if text is not None else None
    where = f"{source} line {line}" if line is not None else source
    return f"{where}: {loc_text(loc) or 'document'}: {msg}"


def load_config(path: Path, environ: Mapping[str, str] | None = None) -> NotificationSpec:
    """The configuration in ``path``; NotificationConfigError names the file, line and field."""
    try:
        text = path.read_text(encoding="utf-8")
        doc = yaml.safe_load(text)
    except OSError as exc:
        raise NotificationConfigError(
            [f"{path}: cannot read the notification config: {exc.strerror or exc}"]
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise NotificationConfigError(
            [f"{path}{where}: invalid YAML: {getattr(exc, 'problem', None) or exc}"]
        ) from None
    return parse_config(doc, str(path), text, environ)


def config_path(given: Path | None, state_dir: Path, environ: Mapping[str, str] | None = None) -> Path | None:
    """``--notifications``, else ``$GPUPOOL_NOTIFICATIONS``, else ``notifications.yaml`` in the
    state directory if it exists (as the cost policy's ``cost.yaml``); None: no notifications."""
    env = os.environ if environ is None else environ
    if given is not None:
        return given
    if env.get(FILE_ENV):
        return Path(env[FILE_ENV])
    default = state_dir / DEFAULT_FILE
    return default if default.is_file() else None


__all__ = [
    "API_VERSION",
    "DEFAULT_FILE",
    "FILE_ENV",
    "KIND",
    "STATES",
    "AlertmanagerSpec",
    "EmailSpec",
    "MatchSpec",
    "NotificationConfigError",
    "NotificationSpec",
    "RetrySpec",
    "RouteSpec",
    "SinkSpec",
    "WebhookSpec",
    "config_path",
    "load_config",
    "parse_config",
]
