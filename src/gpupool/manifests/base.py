"""What every manifest shares: the API version and well-known keys, the strict spec base, the
metadata, the error types, and the two results (a validated ``Document``, a model ``Bundle``).

Why one base module: each kind's module (cluster, queues, workloads) builds on these without
importing another kind, and the error collector is the one type the service also uses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpupool.model import Node, PriorityClass, Queue, ResourcePool, Workload

if TYPE_CHECKING:
    from gpupool.manifests.task_types import TaskTypeSpec

API_VERSION = "gpupool.io/v1alpha1"
KINDS = ("Cluster", "ResourcePool", "Queue", "PriorityClass", "Workload")
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"
#: AMD's resource and its node labeller's labels (``-product-name``, ``-vram``: e.g. ``64G``)
AMD_GPU = "amd.com/gpu"
AMD_PRODUCT = "amd.com/gpu.product-name"
AMD_VRAM = "amd.com/gpu.vram"
#: Ascend NPUs: the device plugin's resources (``huawei.com/Ascend910``) and node labels
#: (``accelerator=huawei-Ascend910``; the chip, e.g. ``910B3``, in ``node.kubernetes.io/npu.chip.name``)
ASCEND_PREFIX = "huawei.com/"
ASCEND_LABEL = "accelerator"
ASCEND_CHIP = "node.kubernetes.io/npu.chip.name"
HAMI_MEM = "nvidia.com/gpumem"
HAMI_CORES = "nvidia.com/gpucores"
KAI_FRACTION = "gpu-fraction"
KAI_MEMORY = "gpu-memory"
RDMA_KEYS = ("rdma", "rdma/hca", "rdma/rdma_shared_device_a", "nvidia.com/hca")


class ManifestError(ValueError):
    """Every problem found in a set of manifests; ``errors`` holds one located line each."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("\n".join(errors))


class StrictModel(BaseModel):
    """The base of every spec: unknown fields are errors, so a typo is reported, not ignored."""

    # floats must be finite: YAML's .inf would otherwise reach weights and prices
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


class ManifestErrors:
    """The located problems found while converting documents to model objects.

    Why a collector, not an exception per problem: every problem of a set is reported in one
    round, so a user fixes them all at once; ``build`` raises ``ManifestError`` at the end."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, msg: str) -> None:
        """Record ``msg`` for the field at ``where`` (``file: document N (Kind/name): field``)."""
        self.items.append(f"{where}: {msg}")


#: object names: a DNS subdomain, as Kubernetes (and the store) require
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
_NAME_RE = re.compile(NAME_PATTERN)


class Metadata(StrictModel):
    name: str = Field(min_length=1, max_length=253)

    @field_validator("name")
    @classmethod
    def _dns_name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(
                f"{v!r} is not a valid name: lowercase letters, digits, '-' and '.', "
                "starting and ending with a letter or digit"
            )
        return v

    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    namespace: str | None = None


@dataclass(slots=True)
class Document:
    """One validated manifest, still in its spec form (what the store persists)."""

    kind: str
    name: str
    metadata: Metadata
    spec: Any
    raw: dict[str, Any]
    source: str


@dataclass(slots=True)
class Bundle:
    """Model objects built from a set of documents."""

    nodes: list[Node] = field(default_factory=list)
    pools: list[ResourcePool] = field(default_factory=list)
    queues: list[Queue] = field(default_factory=list)
    priority_classes: list[PriorityClass] = field(default_factory=list)
    workloads: list[Workload] = field(default_factory=list)
    documents: list[Document] = field(default_factory=list)
    #: a Cluster's ``spec.fairSharing.usageHalfLife`` in seconds (None: usage decay off)
    usage_half_life_s: float | None = None
    #: task-type defaults of the configuration (``manifests/task_types.py``)
    task_types: TaskTypeTable = field(default_factory=lambda: TaskTypeTable())


@dataclass(slots=True)
class TaskTypeTable:
    """Task-type defaults a configuration sets: the Cluster's ``spec.taskTypes`` and each
    queue's ``spec.typeDefaults``, by type (the packaged defaults come under both)."""

    cluster: dict[str, TaskTypeSpec] = field(default_factory=dict)
    queues: dict[str, dict[str, TaskTypeSpec]] = field(default_factory=dict)
