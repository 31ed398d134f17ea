"""GPU discovery through NVML, with a stand-in ``pynvml`` module (no GPU or driver needed).

The stand-in implements the few NVML calls ``gpupool.discovery.nvml`` makes, with the library's
conventions (``NVMLError`` carrying ``value``, ``NVML_ERROR_TIMEOUT`` from an empty event set),
and is installed as ``pynvml`` with monkeypatch, so ``discover()`` finds it as it would the real one.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from gpupool.discovery import StaticDiscovery, discover, nvlink_islands, parse_fake_gpus
from gpupool.discovery.nvml import NvmlDiscovery, islands_label, model_name


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class Gpu:
    name: str
    mem_mib: int
    uuid: str
    bus: str
    links: list[str] = field(default_factory=list)  # remote bus ids of the active links
    ecc_uncorrected: int | None = 0  # None: ECC not supported
    retired_pending: int = 0
    events: bool = True


class FakeNvml:
    """What pynvml exposes, for the calls the discovery makes."""

    NVMLError = NVMLError
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_NVLINK_MAX_LINKS = 4
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeDoubleBitEccError = 0x2
    nvmlEventTypeXidCriticalError = 0x8

    def __init__(self, gpus: list[Gpu]) -> None:
        self.gpus = gpus
        self.queue: list[Any] = []
        self.registered: set[int] = set()
        self.shut = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.gpus[h].name.encode()

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.gpus[h].uuid

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=self.gpus[h].mem_mib << 20)

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=self.gpus[h].bus.encode())

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if link >= len(self.gpus[h].links):
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        return SimpleNamespace(busId=self.gpus[h].links[link].encode())

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: int, kinds: int, es: str) -> None:
        if not self.gpus[h].events:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        self.registered.add(h)

    def nvmlEventSetWait_v2(self, es: str, timeout_ms: int) -> Any:
        if not self.queue:
            raise NVMLError(self.NVML_ERROR_TIMEOUT)
        return self.queue.pop(0)

    def xid(self, h: int, xid: int) -> None:
        self.queue.append(
            SimpleNamespace(device=h, eventType=self.nvmlEventTypeXidCriticalError, eventData=xid)
        )

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        v = self.gpus[h].ecc_uncorrected
        if v is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return v

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:
        return self.gpus[h].retired_pending


def h100s(n: int = 4, links: dict[int, list[str]] | None = None) -> list[Gpu]:
    return [
        Gpu(
            "NVIDIA H100 80GB HBM3",
            81559,
            f"GPU-{i:08x}",
            f"00000000:{0x10 + i:02x}:00.0",
            (links or {}).get(i, []),
        )
        for i in range(n)
    ]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """Four H100s: 0-1 linked directly, 2-3 linked directly; installed as ``pynvml``."""
    bus = [f"0000:{0x10 + i:02x}:00.0" for i in range(4)]
    fake = FakeNvml(h100s(4, {0: [bus[1]], 1: [bus[0]], 2: [bus[3]], 3: [bus[2]]}))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_devices_come_from_nvml_with_model_memory_uuid_and_index(nvml: FakeNvml) -> None:
    d = discover()
    assert isinstance(d, NvmlDiscovery) and not d.fake
    devs = d.devices()
    assert [x.index for x in devs] == [0, 1, 2, 3]
    assert {x.model for x in devs} == {"H100-80GB"}
    assert devs[2].memory_mib == 81559 and devs[2].uuid == "GPU-00000002"
    assert devs[2].visible_id == "GPU-00000002"  # CUDA_VISIBLE_DEVICES names real devices by UUID
    assert d.describe()["source"] == "nvml"
    d.close()
    assert nvml.shut


def test_nvlink_peers_make_islands_with_either_bus_id_spelling(nvml: FakeNvml) -> None:
    devs = discover().devices()
    assert [x.nvlink_island for x in devs] == [0, 0, 2, 2]
    assert islands_label(devs) == "0_1.2_3"


def test_gpus_linked_through_one_nvswitch_are_one_island() -> None:
    switch = "0000:c0:00.0"
    bus = {i: f"0000:{i:02x}:00.0" for i in range(8)}
    assert set(nvlink_islands(bus, {i: [switch] for i in range(8)}).values()) == {0}
    # no links at all: each device is its own island
    assert nvlink_islands(bus, {}) == {i: i for i in range(8)}


def test_a_critical_xid_event_turns_the_device_unhealthy_and_it_stays_so(nvml: FakeNvml) -> None:
    d = discover()
    assert d.refresh() == {}
    nvml.xid(1, 79)  # fallen off the bus
    bad = d.refresh()
    assert list(bad) == [1] and "Xid 79" in bad[1]
    assert d.refresh() == bad  # sticky: no event now, still unhealthy


def test_an_application_xid_leaves_the_device_in_service(nvml: FakeNvml) -> None:
    d = discover()
    nvml.xid(0, 31)  # a page fault of the application
    nvml.xid(0, 13)
    assert d.refresh() == {}


def test_uncorrected_ecc_errors_and_pending_retired_pages_are_unhealthy(nvml: FakeNvml) -> None:
    nvml.gpus[2].ecc_uncorrected = 3
    nvml.gpus[3].retired_pending = 1
    nvml.gpus[0].ecc_uncorrected = None  # ECC not supported: no verdict from it
    bad = discover().refresh()
    assert sorted(bad) == [2, 3]
    assert "3 uncorrected ECC" in bad[2] and "retired" in bad[3]


def test_a_device_without_events_is_still_checked_by_its_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = h100s(2)
    gpus[0].events = False
    gpus[0].ecc_uncorrected = 1
    fake = FakeNvml(gpus)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    d = discover()
    assert fake.registered == {1}
    assert list(d.refresh()) == [0]


def test_a_host_without_nvml_or_without_gpus_has_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as without the library
    d = discover()
    assert isinstance(d, StaticDiscovery) and d.devices() == [] and not d.fake
    assert "NVML is not available" in d.describe()["note"]
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([]))
    assert discover().devices() == []


def test_fake_gpus_are_parsed_and_marked_fake() -> None:
    devs = parse_fake_gpus("8xH100-80GB")
    assert len(devs) == 8 and devs[7].memory_mib == 80 * 1024 and devs[0].model == "H100-80GB"
    assert all(d.fake for d in devs) and devs[3].visible_id == "3"
    assert [d.memory_mib for d in parse_fake_gpus("2 x A100:40Gi")] == [40960, 40960]
    d = discover("1xL4-24GB")
    assert d.fake and d.describe()["fake"] is True and d.describe()["source"] == "fake"


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("H100-80GB", "expected N x MODEL"),
        ("0xH100-80GB", "between 1 and 64"),
        ("2xH100", "give the memory"),
        ("2xH100:lots", "memory 'lots'"),
    ],
)
def test_a_bad_fake_gpu_spec_names_the_option(spec: str, problem: str) -> None:
    with pytest.raises(ValueError, match="--fake-gpus") as e:
        parse_fake_gpus(spec)
    assert problem in str(e.value)


def test_model_names_are_short() -> None:
    assert model_name("NVIDIA H100 80GB HBM3", 81559) == "H100-80GB"
    assert model_name("NVIDIA A100-SXM4-40GB", 40960) == "A100-40GB"
    assert model_name("NVIDIA H200", 143771) == "H200-140GB"
