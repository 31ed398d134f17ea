"""Incidents reach people (gpupool.service.notify): a webhook, an Alertmanager endpoint and an
SMTP server on 127.0.0.1 receive what an incident's changes say; deliveries are routed, retried
and recorded on the incident; a failing sink holds up neither the alert pass nor another sink;
a bad NotificationConfig is refused naming the file, line and field."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from email import message_from_bytes, policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from gpupool.service.alerts import AlertLoop
from gpupool.service.core import Service
from gpupool.service.notify import NotificationConfigError, Notifier, Router, parse_config
from gpupool.service.notify.config import RouteSpec
from gpupool.store import Store
from gpupool.store.incidents import Firing
from tests.test_service_support import running_app, wait_for

API = "gpupool.io/v1alpha1"
FIRE = Firing("QueueOldestPendingAboveTarget", "queue/vision-team", "warning", "waited 5.0 h")


class Receiver:
    """An HTTP server on 127.0.0.1 that keeps every POST; answers the statuses of ``script`` in
    order, then 200; while ``hold`` is clear it answers nothing (a sink that hangs)."""

    def __init__(self, script: list[int] | None = None) -> None:
        self.script = list(script or [])
        self.got: list[tuple[str, Any, dict[str, str]]] = []
        self.hold = threading.Event()
        self.hold.set()
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                rec.hold.wait(60)
                rec.got.append((self.path, body, dict(self.headers)))
                status = rec.script.pop(0) if rec.script else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.hold.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers() -> Iterator[list[Receiver]]:
    made: list[Receiver] = []
    yield made
    for r in made:
        r.close()


def _receiver(made: list[Receiver], script: list[int] | None = None) -> Receiver:
    made.append(Receiver(script))
    return made[-1]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(f"sqlite:///{tmp_path}/n.db")
    try:
        yield s
    finally:
        s.close()


def _spec(sinks: list[dict[str, Any]], **extra: Any) -> Any:
    spec: dict[str, Any] = {"sinks": sinks, **extra}
    spec.setdefault("retry", {"attempts": 3, "backoff": 0.01, "maxBackoff": 0.05, "timeout": 30})
    spec.setdefault("default", [s["name"] for s in sinks])
    return parse_config({"apiVersion": API, "kind": "NotificationConfig", "spec": spec})


@contextmanager
def _notifier(spec: Any, store: Store) -> Iterator[Notifier]:
    n = Notifier(spec, store, registry=CollectorRegistry())
    n.start()
    try:
        yield n
    finally:
        n.stop()


def _deliveries(store: Store, incident: int, n: int, *, done: bool = True) -> list[dict[str, Any]]:
    """The incident's deliveries once there are ``n`` (all finished when ``done``)."""

    def ready() -> list[dict[str, Any]] | None:
        ds = store.get_incident(incident)["deliveries"]
        finished = all(d["outcome"] in ("delivered", "failed", "dropped") for d in ds)
        return ds if len(ds) == n and (finished or not done) else None

    return cast(list[dict[str, Any]], wait_for(ready, 30, f"{n} deliveries of incident {incident}"))


def _incident(store: Store) -> int:
    return int(store.list_incidents()[0]["id"])


# ------------------------------------------------------------------- the three sinks


def test_a_webhook_receives_the_firing_the_acknowledgement_and_the_resolution(
    store: Store, receivers: list[Receiver]
) -> None:
    hook = _receiver(receivers)
    spec = _spec(
        [{"name": "chat", "webhook": {"url": f"{hook.url}/hooks/gpupool", "headers": {"X-Team": "gpu"}}}],
        externalURL="https://gpupool.example.com",
    )
    with _notifier(spec, store) as n:
        store.sync_incidents([FIRE], on_change=n.notify)
        iid = _incident(store)
        wait_for(lambda: len(hook.got) == 1, 30, "the firing")
        n.notify(store.ack_incident(iid, "alice", "bob"))
        wait_for(lambda: len(hook.got) == 2, 30, "the acknowledgement")
        store.sync_incidents([], on_change=n.notify)  # the condition cleared
        wait_for(lambda: len(hook.got) == 3, 30, "the resolution")
        deliveries = _deliveries(store, iid, 3)
    path, body, headers = hook.got[0]
    assert path == "/hooks/gpupool" and headers["X-Team"] == "gpu"
    assert {k: body[k] for k in ("alert", "severity", "state", "incident", "summary", "link")} == {
        "alert": "QueueOldestPendingAboveTarget",
        "severity": "warning",
        "state": "firing",
        "incident": iid,
        "summary": "waited 5.0 h",
        "link": "https://gpupool.example.com/#/incidents",
    }
    assert body["labels"] == {
        "alertname": "QueueOldestPendingAboveTarget",
        "severity": "warning",
        "queue": "vision-team",
    }
    assert body["firedAt"] and body["sentAt"] and body["resolvedAt"] is None
    acked, resolved = hook.got[1][1], hook.got[2][1]
    assert (acked["state"], acked["owner"], acked["acknowledgedBy"]) == ("acknowledged", "bob", "alice")
    assert (resolved["state"], resolved["resolution"], resolved["resolvedBy"]) == (
        "resolved",
        "condition cleared",
        "gpupool",
    )
    assert [(d["sink"], d["state"], d["outcome"], d["attempts"]) for d in deliveries] == [
        ("chat", "firing", "delivered", 1),
        ("chat", "acknowledged", "delivered", 1),
        ("chat", "resolved", "delivered", 1),
    ]


def test_an_alertmanager_endpoint_receives_its_alert_schema_and_open_alerts_again(
    store: Store, receivers: list[Receiver], tmp_path: Path
) -> None:
    am = _receiver(receivers)
    (tmp_path / "am-token").write_text("tok-1\n")
    sink = {"url": am.url, "resendInterval": 0.05, "bearerTokenFile": str(tmp_path / "am-token")}
    spec = _spec([{"name": "am", "alertmanager": sink}])
    with _notifier(spec, store) as n:
        store.sync_incidents(
            [Firing("GPUUnhealthy", "node/n1/gpu/3", "critical", "GPU 3: Xid 79")], on_change=n.notify
        )
        iid = _incident(store)
        wait_for(lambda: len(am.got) >= 2, 30, "the alert and a resend while open")
        store.sync_incidents([], on_change=n.notify)
        _deliveries(store, iid, 2)
        assert n.workers["am"].sink.open == {}  # type: ignore[attr-defined]
        sent = len(am.got)
        assert n.workers["am"].sink.resend() == 0 and len(am.got) == sent
    path, body, headers = am.got[0]
    assert headers["Authorization"] == "Bearer tok-1"
    assert path == "/api/v2/alerts" and isinstance(body, list) and len(body) == 1
    alert = body[0]
    assert set(alert) == {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}
    assert alert["labels"] == {"alertname": "GPUUnhealthy", "severity": "critical", "node": "n1", "gpu": "3"}
    assert alert["annotations"]["summary"] == "GPU 3: Xid 79"
    assert alert["endsAt"] > alert["startsAt"]  # ahead of now while open
    assert am.got[1][1][0]["labels"] == alert["labels"]  # the resend is the same alert
    last = am.got[-1][1][0]
    assert last["endsAt"] == store.get_incident(iid)["resolvedAt"]


class _Mailbox:
    def __init__(self) -> None:
        self.got: list[Any] = []
        self.logins: list[tuple[bytes, bytes]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.got.append(envelope)
        return "250 OK"

    def authenticate(self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> Any:
        from aiosmtpd.smtp import AuthResult

        self.logins.append((data.login, data.password))
        return AuthResult(success=data.password == b"s3cret")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_email_through_a_local_smtp_server_logs_in_with_the_password_from_the_environment(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    controller_mod = pytest.importorskip("aiosmtpd.controller")
    box = _Mailbox()
    port = _free_port()
    smtp = controller_mod.Controller(
        box, hostname="127.0.0.1", port=port, authenticator=box.authenticate, auth_require_tls=False
    )
    smtp.start()
    monkeypatch.setenv("TEST_SMTP_PASSWORD", "s3cret")
    try:
        email = {
            "host": "127.0.0.1", "port": port, "from": "gpupool@example.com",
            "to": ["oncall@example.com", "lead@example.com"], "username": "gpupool",
            "passwordEnv": "TEST_SMTP_PASSWORD",
        }  # fmt: skip
        with _notifier(_spec([{"name": "mail", "email": email}]), store) as n:
            store.sync_incidents([FIRE], on_change=n.notify)
            [d] = _deliveries(store, _incident(store), 1)
    finally:
        smtp.stop()
    assert (d["outcome"], d["attempts"]) == ("delivered", 1), d
    assert box.logins == [(b"gpupool", b"s3cret")]
    [env] = box.got
    assert env.mail_from == "gpupool@example.com"
    assert env.rcpt_tos == ["oncall@example.com", "lead@example.com"]
    msg = message_from_bytes(env.content, policy=policy.default)
    # a long subject is folded after "Subject:"; unfolded, the space before the value is not part of it
    assert (
        msg["Subject"].strip() == "[gpupool] FIRING warning QueueOldestPendingAboveTarget queue/vision-team"
    )
    text = msg.get_content()
    assert "waited 5.0 h" in text and "queue=vision-team" in text


def test_starttls_verifies_the_relays_certificate_against_the_ca_given(store: Store, tmp_path: Path) -> None:
    controller_mod = pytest.importorskip("aiosmtpd.controller")
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_tls)
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    box, port = _Mailbox(), _free_port()
    smtp = controller_mod.Controller(
        box, hostname="127.0.0.1", port=port, tls_context=server_tls, require_starttls=True
    )
    smtp.start()
    email = {
        "host": "127.0.0.1",
        "port": port,
        "startTLS": True,
        "from": "g@example.com",
        "to": ["o@example.com"],
    }
    try:
        with _notifier(
            _spec([{"name": "mail", "email": {**email, "caFile": str(tmp_path / "ca.pem")}}]), store
        ) as n:
            store.sync_incidents([FIRE], on_change=n.notify)
            [ok] = _deliveries(store, _incident(store), 1)
        with _notifier(_spec([{"name": "mail", "email": email}]), store) as n:  # the system's CAs
            n.notify(store.ack_incident(_incident(store), "alice"))
            _, refused = _deliveries(store, _incident(store), 2)
    finally:
        smtp.stop()
    assert (ok["outcome"], ok["attempts"]) == ("delivered", 1), ok
    assert len(box.got) == 1  # the unverified relay was sent nothing
    assert (refused["outcome"], refused["attempts"]) == ("failed", 3)
    assert "CERTIFICATE_VERIFY_FAILED" in refused["lastError"]


# ------------------------------------------------------------------- retries and isolation


def test_a_sink_that_fails_twice_then_succeeds_records_three_attempts(
    store: Store, receivers: list[Receiver]
) -> None:
    hook = _receiver(receivers, script=[500, 503])
    spec = _spec([{"name": "flaky", "webhook": {"url": hook.url}}])
    with _notifier(spec, store) as n:
        store.sync_incidents([FIRE], on_change=n.notify)
        [d] = _deliveries(store, _incident(store), 1)
    assert (d["outcome"], d["attempts"]) == ("delivered", 3)
    assert d["lastError"].startswith("RuntimeError: HTTP 503")
    assert len(hook.got) == 3


def test_a_sink_that_always_fails_gives_up_after_the_attempts_set(
    store: Store, receivers: list[Receiver]
) -> None:
    hook = _receiver(receivers, script=[500] * 10)
    spec = _spec([{"name": "down", "webhook": {"url": hook.url}}])
    with _notifier(spec, store) as n:
        store.sync_incidents([FIRE], on_change=n.notify)
        [d] = _deliveries(store, _incident(store), 1)
    assert (d["outcome"], d["attempts"]) == ("failed", 3) and "HTTP 500" in d["lastError"]
    assert len(hook.got) == 3


def test_a_hanging_sink_delays_neither_the_alert_pass_nor_another_sink(
    store: Store, receivers: list[Receiver]
) -> None:
    stuck, fine = _receiver(receivers), _receiver(receivers)
    stuck.hold.clear()  # answers nothing until released (its timeout is 30 s)
    spec = _spec(
        [{"name": "stuck", "webhook": {"url": stuck.url}}, {"name": "fine", "webhook": {"url": fine.url}}]
    )
    svc = SimpleNamespace(controller=SimpleNamespace(store=store, clock=time.time), store=store, leader=None)
    with _notifier(spec, store) as n:
        loop = AlertLoop(
            cast(Service, svc), interval_s=3600, registry=CollectorRegistry(),
            rules={FIRE.rule: lambda *_: [FIRE]}, on_change=n.notify,
        )  # fmt: skip
        t0 = time.monotonic()
        assert loop.evaluate_now() == (1, 0)
        pass_s = time.monotonic() - t0
        wait_for(lambda: len(fine.got) == 1, 30, "the healthy sink's delivery")
        ds = {d["sink"]: d for d in store.get_incident(_incident(store))["deliveries"]}
        assert ds["fine"]["outcome"] == "delivered" and ds["stuck"]["outcome"] == "pending"
        stuck.hold.set()
        _deliveries(store, _incident(store), 2)
    assert pass_s < 10  # far below the stuck sink's 30 s timeout: the pass did not wait for it


def test_a_full_queue_drops_the_delivery_and_records_it(store: Store, receivers: list[Receiver]) -> None:
    stuck = _receiver(receivers)
    stuck.hold.clear()
    spec = _spec([{"name": "stuck", "webhook": {"url": stuck.url}}], queueSize=1)
    subjects = [Firing(FIRE.rule, f"queue/q{i}", "warning", "late") for i in range(3)]
    with _notifier(spec, store) as n:
        store.sync_incidents(subjects[:1], on_change=n.notify)
        first = _incident(store)
        wait_for(lambda: n.workers["stuck"].q.empty(), 30, "the worker to take the first delivery")
        store.sync_incidents(subjects, on_change=n.notify)  # one more waits, the third is dropped
        outcomes = sorted(
            d["outcome"] for i in store.list_incidents() if i["id"] != first
            for d in store.get_incident(i["id"])["deliveries"]
        )  # fmt: skip
        stuck.hold.set()
    assert outcomes == ["dropped", "pending"]


# ------------------------------------------------------------------- routing


def test_routes_pick_the_first_match_by_queue_pool_or_severity_else_the_default() -> None:
    spec = _spec(
        [
            {"name": n, "webhook": {"url": "http://127.0.0.1:9"}}
            for n in ("pager", "research", "pools", "all")
        ],
        routes=[
            {"match": {"severity": "critical"}, "sinks": ["pager"]},
            {"match": {"queue": ["research-*", "nlp"]}, "sinks": ["research"]},
            {"match": {"pool": "h100*", "rule": "PoolIdleWhileWorkWaits"}, "sinks": ["pools"]},
        ],
        default=["all"],
    )
    r = Router(spec.routes, spec.default)

    def to(subject: str, severity: str = "warning", rule: str = "PoolIdleWhileWorkWaits") -> list[str]:
        return r.sinks_for({"rule": rule, "subject": subject, "severity": severity})

    assert to("node/n1/gpu/0", "critical") == ["pager"]
    assert to("queue/research-cv") == ["research"] and to("queue/nlp") == ["research"]
    assert to("pool/h100-train") == ["pools"]
    assert to("pool/h100-train", rule="FailuresRising") == ["all"]  # every field given must match
    assert to("queue/vision") == ["all"] and to("node/n1/gpu/0") == ["all"]  # no queue: not a queue route


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["", "a", "b", "c"]), st.sampled_from(["s1", "s2", "s3"])), max_size=5
    ),
    st.sampled_from(["a", "b", "c", "d"]),
)
def test_the_first_matching_route_decides_and_a_catch_all_in_front_takes_everything(
    routes: list[tuple[str, str]], queue: str
) -> None:
    specs = [RouteSpec.model_validate({"match": {"queue": q} if q else {}, "sinks": [s]}) for q, s in routes]
    got = Router(specs, ["dflt"]).sinks_for({"rule": "R", "subject": f"queue/{queue}", "severity": "info"})
    expected = next(([s] for q, s in routes if q in ("", queue)), ["dflt"])
    assert got == expected
    catch_all = RouteSpec.model_validate({"sinks": ["first"]})
    assert Router([catch_all, *specs], ["dflt"]).sinks_for(
        {"rule": "R", "subject": "pool/x", "severity": "info"}
    ) == ["first"]


# ------------------------------------------------------------------- the file


BAD = """\
apiVersion: gpupool.io/v1alpha1
kind: NotificationConfig
spec:
  sinks:
    - name: chat
      webhook:
        url: ftp://chat.example.com/hook
    - name: mail
      email:
        host: smtp.example.com
        from: gpupool@example.com
        to: [oncall@example.com]
        username: gpupool
        password: hunter2
  routes:
    - match: {severity: critcal}
      sinks: [chat]
"""


def _errors(text: str, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(NotificationConfigError) as exc:
        parse_config(yaml.safe_load(text), "n.yaml", text, environ or {})
    return exc.value.errors


def test_a_bad_config_names_the_file_line_and_field_of_every_problem() -> None:
    errors = _errors(BAD)
    assert errors[0] == "n.yaml line 7: spec.sinks[0].webhook.url: must be an http:// or https:// URL"
    assert errors[1].startswith(
        "n.yaml line 14: spec.sinks[1].email.password: a secret is not read from this file"
    )
    assert errors[2].startswith(
        "n.yaml line 16: spec.routes[0].match.severity[0]: Input should be 'critical'"
    )
    assert len(errors) == 3


def test_names_and_secrets_are_checked_against_each_other_and_the_environment(tmp_path: Path) -> None:
    text = """\
apiVersion: gpupool.io/v1alpha1
kind: NotificationConfig
spec:
  sinks:
    - {name: am, alertmanager: {url: "http://am:9093", bearerTokenEnv: AM_TOKEN}}
    - {name: am, webhook: {url: "http://hook:80/x"}}
  routes:
    - {match: {queue: research}, sinks: [pager]}
  default: [am]
"""
    errors = _errors(text)
    assert (
        "n.yaml line 5: spec.sinks[0].alertmanager.bearerTokenEnv: the environment variable AM_TOKEN is not set"
        in errors
    )
    assert "n.yaml line 6: spec.sinks[1].name: duplicate sink name 'am'" in errors
    assert "n.yaml line 8: spec.routes[0].sinks[0]: no sink named 'pager' (sinks: am, am)" in errors
    assert _errors("apiVersion: gpupool.io/v1alpha1\nkind: NotificationConfig\nspec: {sinks: []}\n") == [
        "n.yaml line 3: spec.sinks: List should have at least 1 item after validation, not 0"
    ]
    ok = text.replace("- {name: am, webhook", "- {name: hook, webhook").replace("[pager]", "[hook]")
    assert parse_config(yaml.safe_load(ok), environ={"AM_TOKEN": "t"}).sinks[1].name == "hook"


def test_serve_refuses_a_bad_notifications_file_before_starting(tmp_path: Path) -> None:
    from gpupool.cli.main import app

    bad = tmp_path / "notifications.yaml"
    bad.write_text(BAD)
    res = CliRunner().invoke(app, ["serve", "--state-dir", str(tmp_path), "--notifications", str(bad)])
    assert res.exit_code == 2, res.output  # as every option serve refuses
    assert f"{bad} line 7: spec.sinks[0].webhook.url: must be an http:// or https:// URL" in res.output
    assert not (tmp_path / "gpupool.db").exists()  # nothing started


# ------------------------------------------------------------------- through the server


def test_the_api_notifies_an_acknowledgement_and_describes_the_deliveries(
    tmp_path: Path, receivers: list[Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = _receiver(receivers)
    spec = _spec([{"name": "chat", "webhook": {"url": hook.url}}])
    with running_app(tmp_path, notifications=spec, alerts_interval_s=3600) as api:
        svc = api.c.app.state.svc  # type: ignore[attr-defined]
        svc.store.sync_incidents([FIRE])  # opened without the notifier: only the ack is sent
        iid = _incident(svc.store)
        assert api.req("POST", f"/v1/alerts/{iid}/ack", json={"owner": "bob"}).status_code == 200
        wait_for(lambda: len(hook.got) == 1, 30, "the acknowledgement")
        data = wait_for(
            lambda: (d := api.get(f"/v1/alerts/{iid}"))["deliveries"][0]["outcome"] == "delivered" and d,
            30, "the delivery recorded",
        )  # fmt: skip
        assert api.req("GET", "/v1/alerts/999").status_code == 404
        viewer = api.token_for("v", "viewer")
        assert api.req("GET", f"/v1/alerts/{iid}", token=viewer).status_code == 403
    assert hook.got[0][1]["state"] == "acknowledged" and hook.got[0][1]["owner"] == "bob"
    assert [(d["sink"], d["state"], d["attempts"]) for d in data["deliveries"]] == [
        ("chat", "acknowledged", 1)
    ]

    import gpupool.cli.incidents as cli_incidents

    class FakeApi:
        def __init__(self, *_: Any) -> None:
            pass

        def call(self, method: str, path: str, **_: Any) -> Any:
            assert (method, path) == ("GET", f"/v1/alerts/{iid}")
            return data

    monkeypatch.setattr(cli_incidents, "Api", FakeApi)
    from gpupool.cli.main import app

    out = CliRunner().invoke(app, ["alerts", "describe", str(iid)])
    assert out.exit_code == 0, out.output
    assert "QueueOldestPendingAboveTarget on queue/vision-team (warning), Acknowledged" in out.output
    rows = [line.split() for line in out.output.splitlines()]
    assert rows[6][:4] == ["SINK", "CHANGE", "OUTCOME", "ATTEMPTS"]
    assert rows[7][:4] == ["chat", "acknowledged", "delivered", "1"] and rows[7][-1] == "-"


def test_the_file_is_the_option_else_the_variable_else_the_state_directorys(tmp_path: Path) -> None:
    from gpupool.service.notify import config_path

    given, env = tmp_path / "given.yaml", {"GPUPOOL_NOTIFICATIONS": str(tmp_path / "env.yaml")}
    assert config_path(None, tmp_path, {}) is None  # nothing configured: nothing is sent
    (tmp_path / "notifications.yaml").write_text("")
    assert config_path(None, tmp_path, {}) == tmp_path / "notifications.yaml"
    assert config_path(None, tmp_path, env) == tmp_path / "env.yaml"
    assert config_path(given, tmp_path, env) == given


def test_incidents_open_at_start_are_kept_posted_to_alertmanager(
    store: Store, receivers: list[Receiver]
) -> None:
    from gpupool.service.notify.dispatch import start_notifier

    am = _receiver(receivers)
    store.sync_incidents([FIRE])  # opened before this server started
    spec = _spec([{"name": "am", "alertmanager": {"url": am.url, "resendInterval": 0.05}}])
    svc = SimpleNamespace(
        controller=SimpleNamespace(store=store),
        store=store,
        metrics=SimpleNamespace(registry=CollectorRegistry()),
    )
    n = start_notifier(svc, spec)
    assert n is not None and start_notifier(svc, None) is None
    try:
        wait_for(lambda: am.got, 30, "the open incident posted again")
    finally:
        n.stop()
    assert am.got[0][1][0]["labels"]["queue"] == "vision-team"
    assert store.get_incident(_incident(store))["deliveries"] == []  # a resend is not a new delivery


def test_a_busy_alertmanager_sink_still_resends_its_open_alerts() -> None:
    from prometheus_client import Counter as PromCounter

    from gpupool.service.notify.dispatch import Job, SinkWorker
    from gpupool.service.notify.notice import Notice

    class Busy:
        name, resend_interval_s = "am", 0.05

        def __init__(self) -> None:
            self.sent, self.resent = 0, 0

        def send(self, notice: Any) -> None:
            self.sent += 1

        def keep(self, notice: Any) -> None:
            pass

        def resend(self) -> int:
            self.resent += 1
            return 1

        def close(self) -> None:
            pass

    class NoLog:
        def open_delivery(self, incident: int, sink: str, state: str) -> int:
            return 0

        def update_delivery(self, delivery: int, *, attempts: int, outcome: str, error: str) -> None:
            pass

    sink = Busy()
    counter = PromCounter("t_notifications", "t", ["sink", "outcome"], registry=CollectorRegistry())
    w = SinkWorker(
        cast(Any, sink), _spec([{"name": "am", "webhook": {"url": "http://x:1/"}}]).retry, NoLog(), 1, counter
    )
    stop = threading.Event()
    job = Job(Notice({"id": 1, "state": "Firing"}, "firing"), 0)

    def feed() -> None:  # the queue is never empty for a resend interval
        while not stop.is_set():
            w.q.put(job)

    w.start()
    threading.Thread(target=feed, daemon=True).start()
    try:
        wait_for(lambda: sink.resent >= 2, 30, "resends between deliveries")
    finally:
        stop.set()
        w.stop()
    assert sink.sent > sink.resent
