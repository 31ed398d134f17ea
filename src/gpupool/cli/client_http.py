"""Which server and token the client uses, and the HTTP calls that turn failures into one line.

Why a thin client: all rules live in the server (one place to audit); the client only picks
the server and token (flag > environment > config file > ./.gpupool/admin-token) and reports
every refusal with the server's own message.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import typer
import yaml

from gpupool.cli.client_output import err_console, fail

DEFAULT_SERVER = "http://127.0.0.1:8080"
DEFAULT_TOKEN_FILE = Path(".gpupool") / "admin-token"
CONFIG_FILE = Path("~/.config/gpupool/config.yaml")

ServerOpt = typer.Option(None, "--server", "-s", help="server URL (env GPUPOOL_SERVER)")
TokenOpt = typer.Option(None, "--token", help="API token (env GPUPOOL_TOKEN)")


class CliError(Exception):
    """A failure to report as one line."""


def config_file() -> dict[str, Any]:
    """The client config (``GPUPOOL_CONFIG`` or ~/.config/gpupool/config.yaml); {} when absent."""
    path = Path(os.environ.get("GPUPOOL_CONFIG", str(CONFIG_FILE))).expanduser()
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        fail(f"cannot read the client config {path}: {exc}", 2)
    if not isinstance(data, dict):
        fail(f"the client config {path} must be a mapping with server/token/tokenFile", 2)
    return data


def resolve(server: str | None, token: str | None) -> tuple[str, str | None]:
    """Server and token from flag, environment, config file, then the defaults."""
    cfg = config_file()
    srv = server or os.environ.get("GPUPOOL_SERVER") or cfg.get("server") or DEFAULT_SERVER
    tok = token or os.environ.get("GPUPOOL_TOKEN") or cfg.get("token")
    if not tok:
        tf = Path(
            os.environ.get("GPUPOOL_TOKEN_FILE") or cfg.get("tokenFile") or DEFAULT_TOKEN_FILE
        ).expanduser()
        if tf.exists():
            try:
                tok = tf.read_text(encoding="utf-8").strip()
            except OSError as exc:
                fail(f"cannot read the token file {tf}: {exc.strerror}", 2)
    return str(srv).rstrip("/"), tok


class Api:
    """A small HTTP client that turns every failure into one error line with the server's message."""

    def __init__(self, server: str | None, token: str | None) -> None:
        self.server, self.token = resolve(server, token)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.http = httpx.Client(base_url=self.server, headers=headers, timeout=30.0)

    def call(self, method: str, path: str, *, refused: str | None = None, **kw: Any) -> Any:
        """The decoded answer; any failure exits with the server's message (and ``refused``, a
        line saying what a 4xx answer means for the request, e.g. that nothing was applied)."""
        try:
            r = self.http.request(method, path, **kw)
            leader = standby_leader(r)
            if leader is not None and leader.rstrip("/") != self.server.rstrip("/"):
                # a standby replica names the leader: send the write there, once
                err_console.print(f"note: {self.server} is a standby; sending to the leader {leader}")
                self.server = leader
                self.http = httpx.Client(base_url=leader, headers=self.http.headers, timeout=30.0)
                r = self.http.request(method, path, **kw)
        except httpx.ConnectError:
            fail(
                f"cannot reach the gpupool server at {self.server} (is `gpupool serve` running? set --server or GPUPOOL_SERVER)"
            )
        except httpx.HTTPError as exc:
            fail(f"request to {self.server}{path} failed: {type(exc).__name__}: {exc}")
        if r.status_code >= 400:
            fail(self._refusal(r, refused))
        if r.headers.get("content-type", "").startswith("application/json"):
            return r.json()
        return r.text

    def _refusal(self, r: httpx.Response, refused: str | None) -> str:
        """The lines reporting an HTTP error answer: the message, each field's problem, a hint."""
        try:
            err = r.json()["error"]
            msg = str(err.get("message") or r.reason_phrase)
            details = [e for e in err.get("errors", []) if e.get("message") or e.get("problem")]
        except (ValueError, KeyError, TypeError):
            msg, details = f"{r.status_code} {r.reason_phrase}", []
        lines = [f"{msg} (HTTP {r.status_code})"]
        if len(details) > 1 or (details and details[0].get("problem", "") not in msg):
            lines += [f"  {d.get('field', '')}: {d.get('problem', '')}".rstrip() for d in details]
        if refused and r.status_code < 500:
            lines.append(f"  {refused}")
        if r.status_code == 401 and not self.token:
            lines.append(
                f"  no token found: pass --token, set GPUPOOL_TOKEN, or run from the directory holding {DEFAULT_TOKEN_FILE}"
            )
        return "\n".join(lines)


def standby_leader(r: httpx.Response) -> str | None:
    """The leader's URL when ``r`` is a standby's refusal of a write (gpupool.service.leader)."""
    if r.status_code != 503:
        return None
    try:
        errors = r.json()["error"]["errors"]
    except (ValueError, KeyError, TypeError):
        return None
    url = next((e.get("problem") for e in errors if isinstance(e, dict) and e.get("field") == "leader"), None)
    return url if isinstance(url, str) and url.startswith(("http://", "https://")) else None
