"""Kubernetes-style quantities (``500m``, ``80Gi``), normalised to the integer units the engine uses.

The engine works in integers only (milli-CPU, MiB, milli-GPU) so that arithmetic is exact and
decisions are reproducible bit for bit.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_SUFFIX: dict[str, Decimal] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
}
_RE = re.compile(r"^\s*([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?\s*$")

_DURATION_RE = re.compile(
    r"^\s*(?:(\d+(?:\.\d+)?)d)?\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s)?\s*$"
)


class QuantityError(ValueError):
    """A quantity string that cannot be parsed; the message says what was expected."""


def parse_quantity(value: object) -> Decimal:
    """Parse a Kubernetes quantity into an exact decimal (``"500m"`` -> 0.5, ``"1Gi"`` -> 1073741824)."""
    if isinstance(value, bool):
        raise QuantityError(f"expected a quantity, got a boolean {value!r}")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"expected a finite quantity, got {value!r}")
        return Decimal(repr(value))
    if not isinstance(value, str):
        raise QuantityError(f"expected a quantity such as 4, 500m or 80Gi, got {type(value).__name__}")
    m = _RE.match(value)
    if not m:
        raise QuantityError(
            f"invalid quantity {value!r}: expected a number with an optional suffix (m, Ki, Mi, Gi, Ti, k, M, G, T)"
        )
    try:
        number = Decimal(m.group(1))
    except InvalidOperation as exc:  # pragma: no cover - regex already guards this
        raise QuantityError(f"invalid quantity {value!r}") from exc
    return number * _SUFFIX[m.group(2) or ""]


def _non_negative(d: Decimal, value: object) -> Decimal:
    if d < 0:
        raise QuantityError(f"quantity {value!r} must not be negative")
    return d


def cpu_milli(value: object) -> int:
    """CPU cores to milli-cores, rounding up (a request is never silently shrunk)."""
    d = _non_negative(parse_quantity(value), value)
    return int((d * 1000).to_integral_value(rounding="ROUND_CEILING"))


def memory_mib(value: object) -> int:
    """Bytes-with-suffix to MiB, rounding up. A bare number means bytes, as in Kubernetes."""
    d = _non_negative(parse_quantity(value), value)
    return int((d / (2**20)).to_integral_value(rounding="ROUND_CEILING"))


def mib_value(value: object) -> int:
    """A MiB figure as HAMi writes ``nvidia.com/gpumem`` (a bare number is MiB; a suffix is honoured)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return math.ceil(
            _non_negative(Decimal(repr(value)) if isinstance(value, float) else Decimal(value), value)
        )
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return memory_mib(value)


def gpu_milli(value: object) -> int:
    """GPU count to milli-GPUs: ``8`` -> 8000, ``0.5`` or ``500m`` -> 500."""
    d = _non_negative(parse_quantity(value), value)
    milli = d * 1000
    if milli != milli.to_integral_value():
        raise QuantityError(f"GPU quantity {value!r} is finer than 1/1000 of a GPU")
    return int(milli)


def count(value: object) -> int:
    """A plain non-negative integer count (RDMA devices, replicas)."""
    d = _non_negative(parse_quantity(value), value)
    if d != d.to_integral_value():
        raise QuantityError(f"expected a whole number, got {value!r}")
    return int(d)


def parse_duration(value: object) -> float:
    """Durations as seconds: a number of seconds, or ``1d2h30m10s`` style text."""
    if isinstance(value, bool):
        raise QuantityError(f"expected a duration, got a boolean {value!r}")
    if isinstance(value, int | float):
        if value < 0 or not math.isfinite(value):
            raise QuantityError(f"duration {value!r} must be a finite, non-negative number of seconds")
        return float(value)
    if isinstance(value, str):
        s = value.strip()
        if s and _DURATION_RE.match(s) and any(c.isalpha() for c in s):
            m = _DURATION_RE.match(s)
            assert m is not None
            d, h, mi, se = (float(x) if x else 0.0 for x in m.groups())
            return d * 86400 + h * 3600 + mi * 60 + se
        try:
            f = float(s)
        except ValueError:
            pass
        else:
            return parse_duration(f)
    raise QuantityError(f"invalid duration {value!r}: expected seconds or text like 90m, 2h, 1d12h")


def format_mib(mib: int) -> str:
    """Human-readable memory, e.g. 81920 -> '80Gi'."""
    if mib % (1 << 20) == 0 and mib:
        return f"{mib >> 20}Ti"
    if mib % 1024 == 0 and mib:
        return f"{mib >> 10}Gi"
    return f"{mib}Mi"


def format_gpu(milli: int) -> str:
    """Milli-GPUs for people: 8000 -> '8', 500 -> '0.5'."""
    if milli % 1000 == 0:
        return str(milli // 1000)
    return f"{milli / 1000:g}"


def format_cpu(milli: int) -> str:
    """Milli-CPU for people: 4000 -> '4', 500 -> '500m'."""
    if milli % 1000 == 0:
        return str(milli // 1000)
    return f"{milli}m"
