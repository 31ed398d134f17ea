"""Nodes whose devices are not NVIDIA GPUs: Ascend NPUs and AMD GPUs, read from what their
vendors' Kubernetes components publish.

Why a module of its own: NVIDIA nodes are read from GPU feature discovery and HAMi's register
(``kube/inventory.py``); other vendors publish different things, and each needs its own small
reading of it:

- Ascend (Huawei's Ascend Device Plugin): the allocatable resource ``huawei.com/Ascend910``
  (``Ascend310``, ``Ascend310P``) counts the NPUs; the node label ``accelerator`` is
  ``huawei-Ascend910``; ``node.kubernetes.io/npu.chip.name`` names the chip (``910B3``). No
  label gives the device memory, so it comes from the chip (64 GiB for 910B, 32 GiB for the
  first 910, 24 GiB for 310P, 8 GiB for 310) unless ``gpupool.io/device-memory`` (MiB) says.
- AMD (the ROCm device plugin and its node labeller): ``amd.com/gpu`` counts the GPUs;
  ``amd.com/gpu.product-name`` names the product and ``amd.com/gpu.vram`` its memory (``64G``).

``gpupool.io/gpu-model`` overrides the model name on any node, as for NVIDIA ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool import quantity as qty
from gpupool.manifests.base import AMD_GPU, AMD_PRODUCT, AMD_VRAM, ASCEND_CHIP
from gpupool.model import ACCELERATORS, GPU

#: an administrator's device memory per device, in MiB, where no vendor label gives it
DEVICE_MEMORY = "gpupool.io/device-memory"
MODEL_OVERRIDE = "gpupool.io/gpu-model"

#: device memory of Ascend chips by the start of their chip name (the longest match wins)
_ASCEND_MEMORY_MIB = {"910B": 65536, "910": 32768, "310P": 24576, "310": 8192}


def accelerator_kind(allocatable: Mapping[str, Any], opts: Any) -> str:
    """The kind of a node's devices: the first non-NVIDIA accelerator resource it offers any
    of, else NVIDIA's (``opts.gpu_resource``), which is also what a node without devices is."""
    for kind in ACCELERATORS:
        if kind == GPU or kind == opts.gpu_resource or kind not in allocatable:
            continue
        try:
            if qty.count(allocatable[kind]) > 0:
                return kind
        except qty.QuantityError:
            return kind  # unreadable: other_devices says why
    return str(opts.gpu_resource)


def other_devices(
    kind: str, labels: Mapping[str, str], allocatable: Mapping[str, Any], problems: list[str]
) -> tuple[int, int, str]:
    """(device count, memory MiB per device, model) of an Ascend or AMD node; a value that
    cannot be read is a problem naming the field (the node is then not schedulable)."""
    try:
        count = qty.count(allocatable[kind])
    except qty.QuantityError as exc:
        problems.append(f"status.allocatable.{kind}: {exc}")
        return 0, 0, ""
    model = _model(kind, labels)
    return count, _memory(kind, model, labels, problems), model


def _model(kind: str, labels: Mapping[str, str]) -> str:
    if MODEL_OVERRIDE in labels:
        return labels[MODEL_OVERRIDE]
    if kind == AMD_GPU:
        return labels.get(AMD_PRODUCT, "").replace(" ", "_") or "AMD-GPU"
    family = kind.rsplit("/", 1)[-1]  # Ascend910
    chip = labels.get(ASCEND_CHIP, "")
    return f"Ascend{chip}" if chip and chip[:3].isdigit() else family


def _memory(kind: str, model: str, labels: Mapping[str, str], problems: list[str]) -> int:
    if DEVICE_MEMORY in labels:
        text = labels[DEVICE_MEMORY].strip()
        if text.isdigit():
            return int(text)
        problems.append(f"label {DEVICE_MEMORY}: expected MiB as a whole number, got {text!r}")
        return 0
    if kind == AMD_GPU:
        return _amd_vram(labels, problems)
    chip = model.removeprefix("Ascend")
    best = max((p for p in _ASCEND_MEMORY_MIB if chip.startswith(p)), key=len, default="")
    return _ASCEND_MEMORY_MIB.get(best, 0)


def _amd_vram(labels: Mapping[str, str], problems: list[str]) -> int:
    """``amd.com/gpu.vram`` as the labeller writes it (``64G``: gibibytes of device memory)."""
    text = labels.get(AMD_VRAM, "").strip()
    if not text:
        problems.append(f"label {AMD_VRAM}: missing on an {AMD_GPU} node (or set {DEVICE_MEMORY})")
        return 0
    try:
        return qty.memory_mib(text + "i" if text[-1] in "KMGT" else text)
    except qty.QuantityError as exc:
        problems.append(f"label {AMD_VRAM}: {exc}")
        return 0
