"""What this host has: its GPUs (from NVML, or declared fake ones) and their health.

Why a package of its own: the local backend needs the devices, but so could a node agent or a
``gpupool`` command that shows a host's GPUs; none of them should import the service for it.
"""

from __future__ import annotations

from gpupool.discovery.nvml import (
    Device,
    Discovery,
    NvmlDiscovery,
    StaticDiscovery,
    discover,
    islands_label,
    nvlink_islands,
    parse_fake_gpus,
)

__all__ = [
    "Device",
    "Discovery",
    "NvmlDiscovery",
    "StaticDiscovery",
    "discover",
    "islands_label",
    "nvlink_islands",
    "parse_fake_gpus",
]
