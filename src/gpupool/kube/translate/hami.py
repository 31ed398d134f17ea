"""HAMi's node device register (``hami.io/node-nvidia-register``) read as devices.

Why its own module: the register has two spellings (the JSON list HAMi writes today and the
colon-separated list its protocol document still shows), and either may be half-written or
stale; reading it must never fail the node's translation, only explain what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

#: (HAMi's type string, device memory MiB) -> gpupool model name
ModelOf = Callable[[str, int], str]


class RegisterError(ValueError):
    """A register that cannot be read; the message says which entry and field."""


def parse_register(text: str, model_of: ModelOf) -> list[tuple[int, str, int, bool, str]]:
    """(index, uuid, memory MiB, healthy, type) per device, sorted by index.

    ``model_of`` turns HAMi's type string and memory into a model name."""
    text = text.strip()
    rows = _json_rows(text) if text[:1] in ("[", "{") else _colon_rows(text)
    out = [_device(i, row, model_of) for i, row in enumerate(rows)]
    out.sort(key=lambda d: d[0])
    indices = [d[0] for d in out]
    if len(set(indices)) != len(indices):
        raise RegisterError("two devices with the same index")
    return out


def _json_rows(text: str) -> list[Mapping[str, Any]]:
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RegisterError(f"not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise RegisterError("expected a JSON list of device objects")
    return rows


def _colon_rows(text: str) -> list[Mapping[str, Any]]:
    """The older form: ``id,count,devmem,devcore,type,numa,health:`` per device."""
    rows: list[Mapping[str, Any]] = []
    for n, part in enumerate(p for p in text.split(":") if p.strip()):
        f = part.split(",")
        if len(f) < 7:
            raise RegisterError(f"device {n}: expected 7 comma-separated fields, got {len(f)}")
        rows.append({"id": f[0], "index": n, "devmem": f[2], "type": f[4], "health": f[6]})
    return rows


def _device(n: int, row: Mapping[str, Any], model_of: ModelOf) -> tuple[int, str, int, bool, str]:
    index = _int(row.get("index", n), f"device {n}: index")
    mem = _int(row.get("devmem"), f"device {n}: devmem")
    uuid = row.get("id")
    if not isinstance(uuid, str) or not uuid.strip():
        raise RegisterError(f"device {n}: id: expected the GPU UUID")
    health = row.get("health", True)
    healthy = health if isinstance(health, bool) else str(health).strip().lower() == "true"
    kind = row.get("type", "")
    return index, uuid.strip(), mem, healthy, model_of(str(kind), mem) if kind else ""


def _int(value: object, where: str) -> int:
    if isinstance(value, bool):
        raise RegisterError(f"{where}: expected a whole number, got {value!r}")
    try:
        n = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise RegisterError(f"{where}: expected a whole number, got {value!r}") from None
    if n < 0:
        raise RegisterError(f"{where}: must not be negative")
    return n
