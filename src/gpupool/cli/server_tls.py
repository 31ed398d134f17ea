"""``gpupool serve``'s TLS options: HTTPS with a certificate and key, checked before anything starts.

Why checked here rather than left to uvicorn: a missing key, a key that is not the
certificate's, or one flag without the other would otherwise fail inside uvicorn's start-up,
under a traceback, after the banner said the server was serving. Each problem is one line
naming the flag, exit 2.
"""

from __future__ import annotations

import ssl
import sys
from pathlib import Path
from typing import Annotated, NoReturn, TypedDict

import typer
from rich.console import Console
from rich.markup import escape

err_console = Console(stderr=True, soft_wrap=not sys.stderr.isatty())

TlsCertOpt = Annotated[
    Path | None,
    typer.Option(
        "--tls-cert",
        help="serve HTTPS with this PEM certificate (its chain after it); needs --tls-key",
    ),
]
TlsKeyOpt = Annotated[
    Path | None, typer.Option("--tls-key", help="the PEM private key of --tls-cert (unencrypted)")
]


class UvicornTls(TypedDict, total=False):
    """uvicorn.run's TLS arguments (none: plain HTTP)."""

    ssl_certfile: str
    ssl_keyfile: str


def _fail(msg: str) -> NoReturn:
    err_console.print(f"[red]error:[/] {escape(msg)}", highlight=False)
    raise typer.Exit(2)


def uvicorn_tls(cert: Path | None, key: Path | None) -> UvicornTls:
    """uvicorn's ``ssl_certfile``/``ssl_keyfile`` for the flags ({} for plain HTTP), after
    loading the pair once the way uvicorn will (so a bad pair is refused here, named)."""
    if cert is None and key is None:
        return {}
    if cert is None or key is None:
        given, missing = ("--tls-cert", "--tls-key") if key is None else ("--tls-key", "--tls-cert")
        _fail(f"{given} needs {missing} too: HTTPS takes both the certificate and its key")
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        if not path.is_file():
            _fail(f"{flag} {path}: no such file")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        _fail(f"--tls-cert {cert} / --tls-key {key}: not a PEM certificate and its key ({exc.reason or exc})")
    except OSError as exc:
        _fail(f"--tls-cert {cert} / --tls-key {key}: cannot read: {exc.strerror or exc}")
    return {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}


def scheme(tls: UvicornTls) -> str:
    """The URL scheme the server answers on."""
    return "https" if tls else "http"
