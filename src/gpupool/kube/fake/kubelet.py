"""Simulated kubelet (filled in below)."""

from __future__ import annotations

from typing import Any


def install(runtime: Any, hami: bool) -> None:
    """Register the kubelet's handlers on the runtime."""
