"""This host's GPUs through NVML (``nvidia-ml-py``), or fake ones declared with ``--fake-gpus``.

Why behind a small interface (``Discovery``: ``devices``, ``refresh``, ``describe``, ``close``):
the local backend must run on machines without GPUs (tests, demos, CPU-only hosts) and be tested
without a driver. ``NvmlDiscovery`` takes the NVML module as an argument, so the tests hand it a
stand-in that reports devices, NVLink links, Xid events and ECC counters; ``StaticDiscovery``
holds declared (fake) devices or none at all.

Health is sticky: once NVML reports a device broken (a critical Xid, a double-bit ECC event,
uncorrected volatile ECC errors, retired pages waiting for a reset) it stays unhealthy until the
service restarts or an operator marks it healthy through the API; a flapping device must not
take work, fail it, and take work again.
"""

from __future__ import annotations

import contextlib
import importlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from gpupool import quantity as qty

#: Xids that NVIDIA documents as usually caused by the application, not the device (a bad
#: kernel, a page fault, a process killed mid-work): they fail that job, not the GPU
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
MAX_FAKE_GPUS = 64
_FAKE = re.compile(r"^\s*(\d+)\s*[xX]\s*([A-Za-z0-9][A-Za-z0-9._-]*?)\s*(?::\s*(\S+))?\s*$")
_GB_IN_NAME = re.compile(r"(\d+)\s*G(?:B|i)?$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Device:
    """One GPU as the local backend uses it."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    #: the NVLink island (devices joined by NVLink, directly or through NVSwitch): its lowest index
    nvlink_island: int = -1
    pci_bus_id: str = ""
    fake: bool = False

    @property
    def visible_id(self) -> str:
        """What ``CUDA_VISIBLE_DEVICES`` names it by: the UUID, or the index of a fake device."""
        return str(self.index) if self.fake else self.uuid


class Discovery(Protocol):
    """Where the local backend learns its devices and their health."""

    fake: bool

    def devices(self) -> list[Device]:
        """The devices, by index."""

    def refresh(self) -> dict[int, str]:
        """Read health again; every device found unhealthy so far: index -> reason."""

    def describe(self) -> dict[str, Any]:
        """For the health view: where the devices come from and what they are."""

    def close(self) -> None:
        """Release NVML."""

    def utilisation(self) -> dict[int, Reading]:
        """What each device computes now (index -> reading); a device NVML cannot read is left
        out (unknown is not idle)."""


@dataclass(frozen=True, slots=True)
class Reading:
    """One device's SM utilisation (0-100 %, NVML's ``gpu`` rate over its last sample period)
    and its memory in use (bytes)."""

    sm_percent: float
    memory_used_bytes: int


# ---------------------------------------------------------------------- declared devices
def parse_fake_gpus(spec: str) -> list[Device]:
    """``8xH100-80GB`` or ``2 x A100:40Gi``: N devices of MODEL; memory from the name or ``:MEM``.

    Raises ValueError naming ``--fake-gpus`` and what is wrong."""
    m = _FAKE.match(spec or "")
    if m is None:
        raise ValueError(f"--fake-gpus {spec!r}: expected N x MODEL[-MEM], e.g. 8xH100-80GB or 2xA100:40Gi")
    count, model, mem_text = int(m[1]), m[2], m[3]
    if not 1 <= count <= MAX_FAKE_GPUS:
        raise ValueError(f"--fake-gpus {spec!r}: the count must be between 1 and {MAX_FAKE_GPUS}")
    if mem_text is not None:
        try:
            mem = qty.memory_mib(mem_text)
        except qty.QuantityError as exc:
            raise ValueError(f"--fake-gpus {spec!r}: memory {mem_text!r}: {exc}") from None
    elif (g := _GB_IN_NAME.search(model)) is not None:
        mem = int(g[1]) * 1024
    else:
        raise ValueError(
            f"--fake-gpus {spec!r}: give the memory in the model name ({model}-80GB) "
            f"or after a colon ({model}:80Gi)"
        )
    if mem <= 0:
        raise ValueError(f"--fake-gpus {spec!r}: the memory must be > 0")
    return [Device(i, f"GPU-fake-{i:02d}", model, mem, 0, "", True) for i in range(count)]


@dataclass(slots=True)
class StaticDiscovery:
    """Devices that NVML does not report: fake ones (``--fake-gpus``), or none (a CPU-only host)."""

    listed: list[Device] = field(default_factory=list)
    fake: bool = True
    note: str = ""
    unhealthy: dict[int, str] = field(default_factory=dict)

    def devices(self) -> list[Device]:
        return list(self.listed)

    def mark_unhealthy(self, index: int, reason: str) -> None:
        """What NVML would report for a real device (a demo or test of the failure path)."""
        self.unhealthy.setdefault(index, reason)

    def refresh(self) -> dict[int, str]:
        return dict(self.unhealthy)

    def utilisation(self) -> dict[int, Reading]:
        """Declared devices compute nothing anyone can read: no readings (never "idle")."""
        return {}

    def describe(self) -> dict[str, Any]:
        source = "fake" if self.fake and self.listed else "none"
        out: dict[str, Any] = {"source": source, "fake": bool(self.fake and self.listed)}
        out["devices"] = [_device_view(d) for d in self.listed]
        if self.note:
            out["note"] = self.note
        return out

    def close(self) -> None:
        return None


def _device_view(d: Device) -> dict[str, Any]:
    return {
        "index": d.index,
        "uuid": d.uuid,
        "model": d.model,
        "memoryMiB": d.memory_mib,
        "nvlinkIsland": d.nvlink_island,
        "fake": d.fake,
    }


# ---------------------------------------------------------------------- NVML
def model_name(name: str, memory_mib: int) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100-80GB``: the short names the Cluster manifests use."""
    words = [w for w in re.sub(r"(?i)\bnvidia\b", " ", name).split() if w]
    base = words[0].split("-")[0] if words else "GPU"
    sized = re.search(r"(\d+)GB", name)
    gb = int(sized[1]) if sized else round(memory_mib / 1024)
    return f"{base}-{gb}GB"


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _bus(v: Any) -> str:
    """A PCI bus id in one spelling (NVML writes the domain with 4 or 8 digits)."""
    s = _text(v).strip().lower()
    dom, sep, rest = s.partition(":")
    if not sep:
        return s
    try:
        return f"{int(dom, 16):04x}:{rest}"
    except ValueError:
        return s


def nvlink_islands(bus: Mapping[int, str], peers: Mapping[int, Iterable[str]]) -> dict[int, int]:
    """Each device's NVLink island (its lowest member's index), from each device's active links.

    ``peers[i]`` are the PCI bus ids at the far end of device i's links: another GPU, or an
    NVSwitch (every GPU linked to the same switch is in one island)."""
    parent: dict[Any, Any] = {}

    def find(x: Any) -> Any:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: Any, b: Any) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[rb] = ra

    by_bus = {b: i for i, b in bus.items()}
    for i in bus:
        find(i)
        for far in peers.get(i, ()):
            union(i, by_bus.get(far, f"switch:{far}"))
    lowest: dict[Any, int] = {}
    for i in sorted(bus):
        lowest.setdefault(find(i), i)
    return {i: lowest[find(i)] for i in bus}


class NvmlDiscovery:
    """Devices and health from NVML; ``nvml`` is the ``pynvml`` module (or a stand-in)."""

    fake = False

    def __init__(self, nvml: Any | None = None) -> None:
        self.nvml = nvml if nvml is not None else importlib.import_module("pynvml")
        self.nvml.nvmlInit()
        n = int(self.nvml.nvmlDeviceGetCount())
        self._handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        self._devices = self._read_devices()
        self._unhealthy: dict[int, str] = {}
        self._events = self._register_events()

    def _read_devices(self) -> list[Device]:
        nv = self.nvml
        out: list[Device] = []
        bus: dict[int, str] = {}
        for i, h in enumerate(self._handles):
            mem = int(nv.nvmlDeviceGetMemoryInfo(h).total) // (1 << 20)
            bus[i] = _bus(nv.nvmlDeviceGetPciInfo(h).busId)
            uuid = _text(nv.nvmlDeviceGetUUID(h))
            out.append(Device(i, uuid, model_name(_text(nv.nvmlDeviceGetName(h)), mem), mem, i, bus[i]))
        islands = nvlink_islands(bus, {i: self._link_peers(h) for i, h in enumerate(self._handles)})
        return [replace(d, nvlink_island=islands[d.index]) for d in out]

    def _link_peers(self, handle: Any) -> list[str]:
        nv = self.nvml
        far: list[str] = []
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                if nv.nvmlDeviceGetNvLinkState(handle, link):
                    far.append(_bus(nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
            except nv.NVMLError:
                continue  # no such link on this device, or no NVLink at all
        return far

    def _register_events(self) -> Any:
        nv = self.nvml
        kinds = nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeDoubleBitEccError
        try:
            events = nv.nvmlEventSetCreate()
        except nv.NVMLError:
            return None
        for h in self._handles:
            try:
                nv.nvmlDeviceRegisterEvents(h, kinds, events)
            except nv.NVMLError:
                continue  # this device reports no events (e.g. a consumer board): counters only
        return events

    def devices(self) -> list[Device]:
        return list(self._devices)

    def refresh(self) -> dict[int, str]:
        self._drain_events()
        for d, h in zip(self._devices, self._handles, strict=True):
            if d.index not in self._unhealthy and (why := self._memory_problem(h)):
                self._unhealthy[d.index] = why
        return dict(self._unhealthy)

    def _drain_events(self) -> None:
        nv = self.nvml
        if self._events is None:
            return
        uuids = {d.uuid: d.index for d in self._devices}
        for _ in range(1000):  # a bounded drain: a storm of events must not hold the caller
            try:
                ev = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError:
                return  # NVML_ERROR_TIMEOUT: nothing more (any other error: try next refresh)
            idx = uuids.get(_text(nv.nvmlDeviceGetUUID(ev.device)))
            if idx is None or idx in self._unhealthy:
                continue
            why = self._event_reason(int(ev.eventType), int(ev.eventData))
            if why:
                self._unhealthy[idx] = why

    def _event_reason(self, kind: int, data: int) -> str:
        nv = self.nvml
        if kind & nv.nvmlEventTypeXidCriticalError:
            if data in APPLICATION_XIDS:
                return ""  # the job's fault: the job fails, the device stays in service
            return f"NVML reported Xid {data} (a critical device error)"
        if kind & nv.nvmlEventTypeDoubleBitEccError:
            return "NVML reported a double-bit (uncorrectable) ECC error"
        return ""

    def _memory_problem(self, handle: Any) -> str:
        nv = self.nvml
        try:
            dbe = int(
                nv.nvmlDeviceGetTotalEccErrors(
                    handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
                )
            )
            if dbe > 0:
                return f"{dbe} uncorrected ECC errors since the driver loaded"
        except nv.NVMLError:
            pass  # ECC off or not supported
        try:
            if int(nv.nvmlDeviceGetRetiredPagesPendingStatus(handle)):
                return "retired memory pages are pending: the GPU needs a reset"
        except nv.NVMLError:
            pass
        return ""

    def utilisation(self) -> dict[int, Reading]:
        nv = self.nvml
        out: dict[int, Reading] = {}
        for d, h in zip(self._devices, self._handles, strict=True):
            try:
                rates = nv.nvmlDeviceGetUtilizationRates(h)
                used = int(nv.nvmlDeviceGetMemoryInfo(h).used)
            except nv.NVMLError:
                continue  # fallen off the bus, or no rates on this board: no reading this time
            out[d.index] = Reading(float(rates.gpu), used)
        return out

    def describe(self) -> dict[str, Any]:
        return {"source": "nvml", "fake": False, "devices": [_device_view(d) for d in self._devices]}

    def close(self) -> None:
        # shutting down a half-initialised library: nothing is left to release
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


def discover(fake_gpus: str | None = None, nvml: Any | None = None) -> Discovery:
    """Fake devices when declared; else NVML's; else none (a CPU-only host still serves work)."""
    if fake_gpus:
        return StaticDiscovery(parse_fake_gpus(fake_gpus), True)
    try:
        found = NvmlDiscovery(nvml)
    except Exception as exc:  # no library, no driver, no device: a host without GPUs
        return StaticDiscovery([], False, f"no GPUs: NVML is not available ({type(exc).__name__}: {exc})")
    if not found.devices():
        found.close()
        return StaticDiscovery([], False, "no GPUs: NVML reports no devices")
    return found


def islands_label(devices: Sequence[Device]) -> str:
    """The NVLink islands as a label value (label-safe characters): ``0_1_2_3.4_5_6_7``."""
    groups: dict[int, list[int]] = {}
    for d in devices:
        groups.setdefault(d.nvlink_island, []).append(d.index)
    return ".".join("_".join(str(i) for i in sorted(g)) for _, g in sorted(groups.items()))


__all__ = [
    "APPLICATION_XIDS",
    "Device",
    "Discovery",
    "NvmlDiscovery",
    "Reading",
    "StaticDiscovery",
    "discover",
    "islands_label",
    "model_name",
    "nvlink_islands",
    "parse_fake_gpus",
]
