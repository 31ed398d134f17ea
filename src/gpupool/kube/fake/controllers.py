"""Simulated controllers (filled in below)."""

from __future__ import annotations

from typing import Any


def install(runtime: Any) -> None:
    """Register the controllers' handlers on the runtime."""
