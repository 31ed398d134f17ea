"""GPU product names as gpupool model names (``NVIDIA-H100-80GB-HBM3`` -> ``H100-80GB``).

Why a normal form: pools and workloads name models the way the cluster manifests do
(``ResourcePool.gpu_models``, ``spec.gpuModels``, ``examples/cluster``: ``H100-80GB``,
``A100-40GB``, ``L40S-48GB``), while GPU feature discovery writes the driver's product name
(``NVIDIA-A100-SXM4-40GB``, ``NVIDIA-L40S``, ``Tesla-T4``) and HAMi its own spelling
(``NVIDIA-NVIDIA H100 80GB HBM3``). The rule: drop the vendor words and the sharing/MIG
suffixes, keep the first word (the family: ``H100``, ``A100``, ``L40S``), and append the
memory in GB: the figure written in the product name when there is one, else the device
memory rounded up to the nominal size the vendor sells (46068 MiB -> 48GB, 81559 MiB -> 80GB).
Form factors (SXM4, PCIE, HBM3) are dropped: two cards of one family and one memory size
schedule the same. The rule is idempotent: a gpupool model name maps to itself.
"""

from __future__ import annotations

import re

#: the memory sizes GPUs are sold with, in GB; a device reports a little less than its size
NOMINAL_GB = (4, 6, 8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 128, 141, 144, 180, 192, 256, 288)
_VENDOR_WORDS = {"NVIDIA", "TESLA", "GEFORCE", "QUADRO"}
_SUFFIXES = re.compile(r"-(SHARED|MIG-.*)$", re.IGNORECASE)
_GB = re.compile(r"^(\d+)GB$", re.IGNORECASE)
#: series words that name no card alone (``RTX-A6000``, ``RTX-4090``): the family is two words
_SERIES = {"RTX"}


def nominal_gb(memory_mib: int) -> int:
    """The sold size of a device reporting ``memory_mib`` (the driver keeps a few percent back)."""
    gib = memory_mib / 1024
    for size in NOMINAL_GB:
        if size >= gib - 0.5:
            return size
    return round(gib)


def model_name(product: str, memory_mib: int = 0) -> str:
    """The gpupool model name of a product string; '' when the string names no GPU."""
    words = [w for w in re.split(r"[-_\s]+", _SUFFIXES.sub("", product.strip())) if w]
    words = [w for w in words if w.upper() not in _VENDOR_WORDS]
    if not words:
        return ""
    family = words[0].upper()
    if family in _SERIES and len(words) > 1 and not _GB.match(words[1]):
        family, words = f"{family}-{words[1].upper()}", words[1:]
    if _GB.match(family):  # a name that is only a size has no family
        return ""
    stated = next((int(m.group(1)) for w in words[1:] if (m := _GB.match(w))), 0)
    gb = stated or (nominal_gb(memory_mib) if memory_mib > 0 else 0)
    return f"{family}-{gb}GB" if gb else family
