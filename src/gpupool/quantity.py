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


#: Why bounds at parse time: every quantity the engine sees must stay exact in int64 (numpy
#: arrays in the fragmentation measure) even when multiplied by replicas and summed over a
#: cluster; one absurd request (``cpu: 1e308``) once failed every scheduling cycle for everyone.
#: The bounds are far above any real machine, so no honest request meets them.
MAX_QUANTITY = Decimal(10) ** 15
MAX_CPU_MILLI = 10**9  # one million cores
MAX_MEMORY_MIB = 1 << 40  # one exbibyte
MAX_GPU_MILLI = 10**9  # one million GPUs
MAX_COUNT = 10**6
MAX_DURATION_S = 100 * 365 * 86400.0  # a century
MAX_TEXT = 64  # characters of a quantity or duration string (the grammar needs far fewer)


def _bounded(n: int, limit: int, value: object, unit: str) -> int:
    if n > limit:
        raise QuantityError(f"quantity {value!r} is too large (at most {limit:,} {unit})".replace(" )", ")"))
    return n


def parse_quantity(value: object) -> Decimal:
    """Parse a Kubernetes quantity into an exact decimal (``"500m"`` -> 0.5, ``"1Gi"`` -> 1073741824)."""
    if isinstance(value, bool):
        raise QuantityError(f"expected a quantity, got a boolean {value!r}")
    if isinstance(value, int):
        if abs(value) > MAX_QUANTITY:
            raise QuantityError(f"quantity {value!r} is too large")
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"expected a finite quantity, got {value!r}")
        if abs(value) > MAX_QUANTITY:
            raise QuantityError(f"quantity {value!r} is too large")
        return Decimal(repr(value))
    if not isinstance(value, str):
        raise QuantityError(f"expected a quantity such as 4, 500m or 80Gi, got {type(value).__name__}")
    if len(value) > MAX_TEXT:
        raise QuantityError(f"invalid quantity: {len(value)} characters, at most {MAX_TEXT}")
    m = _RE.match(value)
    if not m:
        raise QuantityError(
            f"invalid quantity {value!r}: expected a number with an optional suffix (m, Ki, Mi, Gi, Ti, k, M, G, T)"
        )
    try:
        number = Decimal(m.group(1))
    except InvalidOperation as exc:  # pragma: no cover - regex already guards this
        raise QuantityError(f"invalid quantity {value!r}") from exc
    # compare exponents first: arithmetic on 1e999999999 overflows the decimal context itself
    if not number.is_finite() or (number and number.adjusted() > 15) or abs(number) > MAX_QUANTITY:
        raise QuantityError(f"quantity {value!r} is too large")
    return number * _SUFFIX[m.group(2) or ""]


def _non_negative(d: Decimal, value: object) -> Decimal:
    if d < 0:
        raise QuantityError(f"quantity {value!r} must not be negative")
    return d


def cpu_milli(value: object) -> int:
    """CPU cores to milli-cores, rounding up (a request is never silently shrunk)."""
    d = _non_negative(parse_quantity(value), value)
    n = int((d * 1000).to_integral_value(rounding="ROUND_CEILING"))
    return _bounded(n, MAX_CPU_MILLI, value, "milli-CPU")


def memory_mib(value: object) -> int:
    """Bytes-with-suffix to MiB, rounding up. A bare number means bytes, as in Kubernetes."""
    d = _non_negative(parse_quantity(value), value)
    n = int((d / (2**20)).to_integral_value(rounding="ROUND_CEILING"))
    return _bounded(n, MAX_MEMORY_MIB, value, "MiB")


def mib_value(value: object) -> int:
    """A MiB figure as HAMi writes ``nvidia.com/gpumem`` (a bare number is MiB; a suffix is honoured)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _bounded(math.ceil(_non_negative(parse_quantity(value), value)), MAX_MEMORY_MIB, value, "MiB")
    if isinstance(value, str) and value.strip().isdigit():
        return _bounded(int(parse_quantity(value.strip())), MAX_MEMORY_MIB, value, "MiB")
    return memory_mib(value)


def storage_mib(value: object) -> int:
    """``ephemeral-storage`` as Kubernetes writes it (bytes, with an optional suffix) to MiB,
    rounding up: the same grammar as memory, so a pod's request reads the same in both places."""
    return memory_mib(value)


MAX_BANDWIDTH_MBPS = 10**9  # a petabit per second


def bandwidth_mbps(value: object) -> int:
    """Network bandwidth as a count of Mbit/s, rounding up: ``25000`` (or ``25k``) is 25 Gbit/s.

    Why a count and not bits per second: on Kubernetes the bandwidth is an extended resource,
    and the kubelet admits a pod by comparing its request with the node's allocatable as plain
    numbers, so the manifest, the node and the pod must count in the same unit; a suffix is
    Kubernetes' multiplier of that count, never a unit of its own."""
    if isinstance(value, bool):
        raise QuantityError(f"expected a bandwidth in Mbit/s, got a boolean {value!r}")
    d = _non_negative(parse_quantity(value), value)
    n = int(d.to_integral_value(rounding="ROUND_CEILING"))
    return _bounded(n, MAX_BANDWIDTH_MBPS, value, "Mbit/s")


def gpu_milli(value: object) -> int:
    """GPU count to milli-GPUs: ``8`` -> 8000, ``0.5`` or ``500m`` -> 500."""
    d = _non_negative(parse_quantity(value), value)
    milli = d * 1000
    if milli != milli.to_integral_value():
        raise QuantityError(f"GPU quantity {value!r} is finer than 1/1000 of a GPU")
    return _bounded(int(milli), MAX_GPU_MILLI, value, "milli-GPU")


def count(value: object) -> int:
    """A plain non-negative integer count (RDMA devices, replicas)."""
    d = _non_negative(parse_quantity(value), value)
    if d != d.to_integral_value():
        raise QuantityError(f"expected a whole number, got {value!r}")
    return _bounded(int(d), MAX_COUNT, value, "")


def parse_duration(value: object) -> float:
    """Durations as seconds: a number of seconds, or ``1d2h30m10s`` style text, at most a century
    (a longer one overflows the date arithmetic of every consumer)."""
    secs = _parse_duration(value)
    if secs > MAX_DURATION_S:
        raise QuantityError(f"duration {value!r} is too long (at most 100 years)")
    return secs


def _parse_duration(value: object) -> float:
    if isinstance(value, bool):
        raise QuantityError(f"expected a duration, got a boolean {value!r}")
    if isinstance(value, int | float):
        if value < 0 or not math.isfinite(value):
            raise QuantityError(f"duration {value!r} must be a finite, non-negative number of seconds")
        return float(value)
    if isinstance(value, str) and len(value) <= MAX_TEXT:
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
            return _parse_duration(f)
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


def format_mbps(mbps: int) -> str:
    """Network bandwidth for people: 25000 -> '25Gbit/s', 500 -> '500Mbit/s'."""
    if mbps % 1000 == 0 and mbps:
        return f"{mbps // 1000}Gbit/s"
    return f"{mbps}Mbit/s"
