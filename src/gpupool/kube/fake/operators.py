"""Every owner controller of the fake cluster, registered on a runtime: the built-in ones
(``controllers``: Job, ReplicaSet, Deployment, StatefulSet) and the training operators
(``training``: PyTorchJob, JobSet).

Why a module of its own: the training operators are built on ``controllers.Reconciler``; were
the registration in ``controllers``, it would import ``training`` back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpupool.kube.fake.controllers import (
    DeploymentController,
    JobController,
    ReplicaSetController,
    StatefulSetController,
)
from gpupool.kube.fake.training import JobSetController, PyTorchJobController

if TYPE_CHECKING:
    from gpupool.kube.fake.runtime import Runtime


def install(runtime: Runtime) -> None:
    """Register the controllers' handlers on the runtime."""
    ops = runtime.srv.ops
    for ctl in (
        JobController(ops),
        ReplicaSetController(ops),
        DeploymentController(ops),
        StatefulSetController(ops),
        PyTorchJobController(ops),
        JobSetController(ops),
    ):
        runtime.on(ctl.key, ctl.on_owner)
        for child in ctl.child_keys:
            runtime.on(child, ctl.on_child)
        runtime.sims.append(ctl)
