"""``gpupool serve``'s fairness options (gpupool.service.limits): the default pending limits of a
leaf queue and the submit rate per API token, checked before anything starts: every problem is
one line naming the option, exit 2.

Why a module of its own: serve's module holds the options of every other part; these three and
their checks are one idea (how much one tenant may ask of the scheduler).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from gpupool.service.limits import TenantLimits

err_console = Console(stderr=True, soft_wrap=not sys.stderr.isatty())

PendingLimitOpt = Annotated[
    list[str],
    typer.Option(
        "--pending-limit",
        help="default pending limit of a leaf queue that sets none: NAME=N, NAME a spec.limits field "
        "(maxPendingWorkloads, maxPendingPods, maxPendingWorkloadsPerUser, maxPendingPodsPerUser); repeatable",
    ),
]
SubmitRateOpt = Annotated[
    str | None,
    typer.Option(
        "--submit-rate", help="submits each API token may make, e.g. 10/s or 600/m (default: unlimited)"
    ),
]
SubmitBurstOpt = Annotated[
    int | None,
    typer.Option(
        "--submit-burst", help="submits a token may make at once (default: the rate a second, at least 1)"
    ),
]


def _fail(msg: str) -> NoReturn:
    err_console.print(f"[red]error:[/red] {escape(msg)}")
    raise typer.Exit(2)


def tenant_limits(pending: list[str], rate: str | None, burst: int | None) -> TenantLimits:
    """The service's TenantLimits from --pending-limit, --submit-rate and --submit-burst."""
    from gpupool.service.limits import TenantLimits, parse_pending_limits, parse_rate

    try:
        default = parse_pending_limits(pending)
    except ValueError as exc:
        _fail(str(exc))
    try:
        per_s = parse_rate(rate) if rate is not None else None
    except ValueError as exc:
        _fail(f"--submit-rate {exc}")
    if burst is not None and burst < 1:
        _fail(f"--submit-burst {burst}: must be 1 or more")
    return TenantLimits(default, per_s, burst)
