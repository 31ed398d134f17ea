"""``gpupool serve``'s audit witness options (gpupool.service.audit_witness), checked before anything
starts: every problem is one line naming the option, exit 2.

Why a module of its own: serve's module holds the options of every other part; these three and
their checks are one idea (where the server's signed checkpoints go, and with which key).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from gpupool.service.audit_witness import WitnessSettings

err_console = Console(stderr=True, soft_wrap=not sys.stderr.isatty())

AuditEveryOpt = Annotated[
    str,
    typer.Option(
        "--audit-checkpoint-every",
        help="take a signed audit checkpoint this often (and at start and shutdown), e.g. 10m; off to disable",
    ),
]
AuditWitnessOpt = Annotated[
    str | None,
    typer.Option(
        "--audit-witness",
        help="where checkpoints go: a file (append-only JSON lines), an http(s):// URL or "
        "configmap://NAMESPACE/NAME (default: audit-witness.jsonl in --state-dir)",
    ),
]
AuditKeyOpt = Annotated[
    Path | None,
    typer.Option(
        "--audit-key",
        help="Ed25519 key from `gpupool audit keygen` that signs checkpoints "
        "(default: audit-witness.key in --state-dir, generated on first start)",
    ),
]


def _fail(msg: str) -> NoReturn:
    err_console.print(f"[red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def settings(every: str, target: str | None, key: Path | None, state_dir: Path) -> WitnessSettings | None:
    """The witness's settings (None: off) with its key loaded, or made at the default path when
    absent there (an operator who names a key with --audit-key expects it to exist)."""
    from gpupool.service.audit_witness import CONFIGMAP, prepare, settings_from_options

    try:
        given = settings_from_options(every, target, key, state_dir)
        ready = None if given is None else prepare(given, generate=key is None)
    except ValueError as exc:
        _fail(str(exc))
    if ready is not None and ready.target.startswith(CONFIGMAP):
        from gpupool.kube.client import make_client  # the service does not import kube itself

        ready = replace(ready, kube_client=make_client)
    return ready


def banner(given: WitnessSettings | None) -> str:
    """The banner's line: where checkpoints go, how often, which key (and whether it is new)."""
    from gpupool.service.audit_witness import banner_line

    return banner_line(given)
