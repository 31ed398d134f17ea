"""The controller (gpupool.service.controller.core) and the names its callers import with it.

Why a package: the controller is composed of parts, one idea a module (config, pending,
cycle, commit, finish, approvals, recovery), each a class with its own state that the
``Controller`` makes and holds as a field, passing it the shared ``Context`` (context.py) and
the other parts it calls; this package keeps them together and keeps
``from gpupool.service.controller import Controller`` the one import path for callers.
"""

from __future__ import annotations

from gpupool.service.controller.context import (
    ACTIVE,
    DEFAULT_EXCEPTION_S,
    EXCEPTION_EVENT,
    PENDING_CODES,
    SCHEDULER,
    CycleStats,
    Hooks,
)
from gpupool.service.controller.core import Controller

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
