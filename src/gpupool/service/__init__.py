"""The gpupool control plane: REST API, controller loop, backends, service settings.

Why a package of its own: the engine stays pure and the store stays engine-agnostic; this is
the one place that wires them to the outside world (HTTP, a cluster backend).
"""

from gpupool.service.config import ServiceConfig

__all__ = ["ServiceConfig"]
