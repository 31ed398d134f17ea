"""Continue tokens for paged lists, as Kubernetes lists use them: opaque to the client, carrying
where the last page ended and in which order, so the next page starts exactly after it.

Why a token rather than an offset: new workloads arrive while someone pages; an offset would
repeat or skip objects, a position by seq does neither.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Literal

from gpupool.service.errors import ApiError
from gpupool.service.routes.base import MAX_ID

Order = Literal["newest", "oldest"]


def make_continue(newest_first: bool, last_seq: int) -> str:
    """The token of the page after the one that ended at ``last_seq``."""
    raw = json.dumps({"o": "n" if newest_first else "o", "s": last_seq}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def read_continue(token: str) -> tuple[bool, int]:
    """``(newest_first, last_seq)`` of a token; 422 naming ``continue`` for anything else."""
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        newest, seq = {"n": True, "o": False}[data["o"]], data["s"]
        # bounded as every id the API takes (SQLite cannot even bind a larger one)
        if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= MAX_ID:
            raise ValueError(seq)
    except (ValueError, KeyError, TypeError, binascii.Error, UnicodeDecodeError):
        raise ApiError(
            422,
            "continue: not a token this server gave",
            [{"field": "continue", "problem": "pass metadata.continue from the previous page unchanged"}],
        ) from None
    return newest, seq
