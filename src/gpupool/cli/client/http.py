"""Which server and token the client uses, and the HTTP calls that turn failures into one line.

Why a thin client: all rules live in the server (one place to audit); the client only picks
the server and token (flag > environment > config file > the token file of the server's state
directory) and reports every refusal with the server's own message.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import typer
import yaml

from gpupool.cli.client.output import err_console, fail
from gpupool.cli.common import invocation

DEFAULT_SERVER = "http://127.0.0.1:8080"
DEFAULT_STATE_DIR = Path(".gpupool")  # what `gpupool serve` uses without --state-dir
TOKEN_FILE_NAME = "admin-token"  # the bootstrap token `gpupool serve` writes in its state dir
DEFAULT_TOKEN_FILE = DEFAULT_STATE_DIR / TOKEN_FILE_NAME
STATE_DIR_ENV = "GPUPOOL_STATE_DIR"
CA_ENV = "GPUPOOL_CA"
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


@dataclass
class TokenSource:
    """Where the token came from, or every place looked at when none was found: a 401 then
    names them and how to pass one (the server's state dir is often not the current one)."""

    token: str | None = None
    origin: str = ""
    looked: list[str] = field(default_factory=list)

    def advice(self) -> str:
        """The line a 401 ends with: the token that was refused, or where none was found."""
        if self.token:
            return (
                f"  the token from {self.origin} was refused: is it this server's? "
                f"pass --token, set GPUPOOL_TOKEN, or point at the server's state dir with "
                f"`gpupool --state-dir DIR ...` or GPUPOOL_STATE_DIR"
            )
        return (
            f"  no token found: looked in {', '.join(self.looked)}; pass --token, set GPUPOOL_TOKEN "
            f"or GPUPOOL_TOKEN_FILE, or point at the state dir `gpupool serve --state-dir` wrote "
            f"with `gpupool --state-dir DIR ...` or GPUPOOL_STATE_DIR"
        )


def state_dir(cfg: dict[str, Any]) -> Path:
    """The server's state directory the token file is in: ``gpupool --state-dir``, then
    ``GPUPOOL_STATE_DIR``, then the config file's ``stateDir``, then ``.gpupool`` (serve's default)."""
    chosen = invocation.state_dir or os.environ.get(STATE_DIR_ENV) or cfg.get("stateDir")
    return Path(str(chosen)).expanduser() if chosen else DEFAULT_STATE_DIR


def find_token(token: str | None, cfg: dict[str, Any]) -> TokenSource:
    """The token: flag, ``GPUPOOL_TOKEN``, the config's ``token``, then the first token file that
    exists of ``GPUPOOL_TOKEN_FILE`` (or the config's ``tokenFile``) and the state dir's."""
    if token:
        return TokenSource(token, "--token")
    for origin, value in (
        ("GPUPOOL_TOKEN", os.environ.get("GPUPOOL_TOKEN")),
        ("the client config", cfg.get("token")),
    ):
        if value:
            return TokenSource(str(value), origin)
    explicit = os.environ.get("GPUPOOL_TOKEN_FILE") or cfg.get("tokenFile")
    files = [Path(str(explicit)).expanduser()] if explicit else []
    files.append(state_dir(cfg) / TOKEN_FILE_NAME)
    for tf in files:
        if tf.exists():
            try:
                return TokenSource(tf.read_text(encoding="utf-8").strip(), str(tf))
            except OSError as exc:
                fail(f"cannot read the token file {tf}: {exc.strerror}", 2)
    return TokenSource(looked=[str(f.absolute()) for f in files])


def server_verify(cfg: dict[str, Any]) -> ssl.SSLContext | bool:
    """How an https server's certificate is checked: against ``gpupool --ca-file``, then
    ``GPUPOOL_CA``, then the config's ``caFile``, else the system's trust store (True)."""
    chosen = invocation.ca_file or os.environ.get(CA_ENV) or cfg.get("caFile")
    if not chosen:
        return True
    path = Path(str(chosen)).expanduser()
    try:
        return ssl.create_default_context(cafile=str(path))
    except FileNotFoundError:
        fail(f"--ca-file {path}: no such file", 2)
    except (ssl.SSLError, OSError) as exc:
        fail(f"--ca-file {path}: not a PEM CA certificate ({exc})", 2)
    return True  # unreachable: fail exits


def unverified(exc: BaseException) -> str | None:
    """Why the server's certificate was refused, when that is what ``exc`` (an httpx error) is."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return str(seen.verify_message or seen.reason)
        seen = seen.__cause__ or seen.__context__
    return "certificate verify failed" if "CERTIFICATE_VERIFY_FAILED" in str(exc) else None


def resolve(server: str | None, token: str | None) -> tuple[str, str | None]:
    """Server and token from flag, environment, config file, then the defaults."""
    srv, source = _resolve(server, token)
    return srv, source.token


def _resolve(server: str | None, token: str | None) -> tuple[str, TokenSource]:
    cfg = config_file()
    srv = server or os.environ.get("GPUPOOL_SERVER") or cfg.get("server") or DEFAULT_SERVER
    return str(srv).rstrip("/"), find_token(token, cfg)


class Api:
    """A small HTTP client that turns every failure into one error line with the server's message."""

    def __init__(self, server: str | None, token: str | None) -> None:
        self.server, self.source = _resolve(server, token)
        self.token = self.source.token
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.verify = server_verify(config_file())
        self.http = self._client(self.server, headers)

    def _client(self, base: str, headers: Any) -> httpx.Client:
        """A client for ``base``. Why plain http gets ``verify=False``: it makes no TLS
        connection, and httpx builds the certificate store it would check with (``verify=True``
        loads the whole CA bundle) when the client is made, a third of a client command's start."""
        verify = self.verify if base.lower().startswith("https:") else False
        return httpx.Client(base_url=base, headers=headers, timeout=30.0, verify=verify)

    def call(
        self,
        method: str,
        path: str,
        *,
        refused: str | None = None,
        sources: Sequence[str] = (),
        **kw: Any,
    ) -> Any:
        """The decoded answer; any failure exits with the server's message (and ``refused``, a
        line saying what a 4xx answer means for the request, e.g. that nothing was applied).
        ``sources``: where each item of a set came from (``file: document N (Kind/name)``), so
        the server's ``items[i]`` in an error names the document the user wrote."""
        try:
            r = self.http.request(method, path, **kw)
            leader = standby_leader(r)
            if leader is not None and leader.rstrip("/") != self.server.rstrip("/"):
                # a standby replica names the leader: send the write there, once
                err_console.print(f"note: {self.server} is a standby; sending to the leader {leader}")
                self.server = leader
                self.http = self._client(leader, self.http.headers)
                r = self.http.request(method, path, **kw)
        except httpx.ConnectError as exc:
            if (why := unverified(exc)) is not None:
                fail(
                    f"cannot verify the TLS certificate of {self.server} ({why}): pass the CA that "
                    f"signed it with `gpupool --ca-file FILE ...` or GPUPOOL_CA"
                )
            fail(
                f"cannot reach the gpupool server at {self.server} (is `gpupool serve` running? set --server or GPUPOOL_SERVER)"
            )
        except httpx.HTTPError as exc:
            fail(f"request to {self.server}{path} failed: {type(exc).__name__}: {exc}")
        if r.status_code >= 400:
            fail(named(self._refusal(r, refused), sources))
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
        lines += [f"  {line}" for line in _detail_lines(msg, details)]
        if refused and r.status_code < 500:
            lines.append(f"  {refused}")
        if r.status_code == 409 and any(
            d.get("field", "").endswith("metadata.resourceVersion") for d in details
        ):
            lines.append(
                "  read the object again (gpupool get KIND NAME -o yaml), redo the change and apply it; "
                "or drop metadata.resourceVersion to overwrite"
            )
        if r.status_code == 401:
            lines.append(self.source.advice())
        return "\n".join(lines)


def _detail_lines(msg: str, details: list[dict[str, Any]]) -> list[str]:
    """One line per error item, each naming its document and field (the item's ``message``,
    where a set's ``items[i]`` is renamed later); a lone item the message already says is
    shown by where it is only."""
    if len(details) == 1 and details[0].get("problem", "") in msg:
        d = details[0]
        where = str(d.get("message", "")).removesuffix(str(d.get("problem", ""))).rstrip(": ")
        return [where] if where and where not in msg else []
    return [
        str(d.get("message") or f"{d.get('field', '')}: {d.get('problem', '')}").rstrip() for d in details
    ]


_ITEM = re.compile(r"items\[(\d+)\](?:: document 1 \([^)]*\))?")


def named(text: str, sources: Sequence[str]) -> str:
    """``text`` with each ``items[i]`` of the server's answer replaced by where item ``i`` came
    from (the server numbers the set it was sent; the user knows files and documents)."""
    if not sources:
        return text

    def one(m: re.Match[str]) -> str:
        i = int(m[1])
        return sources[i] if i < len(sources) else m[0]

    return _ITEM.sub(one, text)


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
