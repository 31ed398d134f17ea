"""The controller (gpupool.service.controller.core) and the names its callers import with it.

Why a package: the controller is made of parts, one idea a module (configuration, pending set,
cycle, commit, finishing, approvals, recovery); this package keeps them together and keeps
``from gpupool.service.controller import Controller`` the one import path for callers.
"""

from __future__ import annotations

from gpupool.service.controller.core import Controller
from gpupool.service.controller.state import (
    ACTIVE,
    DEFAULT_EXCEPTION_S,
    EXCEPTION_EVENT,
    PENDING_CODES,
    SCHEDULER,
    CycleStats,
    Hooks,
)

__all__ = [
    "ACTIVE",
    "DEFAULT_EXCEPTION_S",
    "EXCEPTION_EVENT",
    "PENDING_CODES",
    "SCHEDULER",
    "Controller",
    "CycleStats",
    "Hooks",
]
