"""Kubernetes-style YAML manifests -> model objects, with located, complete error reports.

A file is accepted whole or rejected whole: every error in every document is collected and
reported as ``file: document N (Kind/name): field.path: problem`` so nothing is half-applied.

The package, by idea (everything public is importable from ``gpupool.manifests`` as well):

- ``base``: the API version and well-known keys, ``StrictModel``, ``Metadata``, the errors
  (``ManifestError``, the collector ``ManifestErrors``), ``Document`` and ``Bundle``;
- ``cluster``: Cluster and ResourcePool specs, and the nodes and pools built from them;
- ``queues``: Queue and PriorityClass specs, quotas, and the default priority classes;
- ``workloads``: the Workload spec, pod requests, and the model workload;
- ``documents``: YAML text and files to validated documents (``validate_document``);
- ``bundle``: documents to a ``Bundle`` with the references between objects checked.
- ``convert``: stored JSON (manifests, placements) to model objects and back, for the store's
  users (the service, the cost reports); imported from ``gpupool.manifests.convert`` only.
- ``mutate``: what the mutating admission webhook does to a Kubernetes object bound for a
  gpupool queue (pure: object in, changed copy and JSON patch out); imported from its module.
"""

from gpupool.manifests import templates as _templates  # noqa: F401  (registers the TeamTemplate kind)
from gpupool.manifests.base import (
    API_VERSION,
    GFD_MEMORY,
    GFD_PRODUCT,
    HAMI_CORES,
    HAMI_MEM,
    KAI_FRACTION,
    KAI_MEMORY,
    KINDS,
    KUEUE_QUEUE_LABEL,
    NAME_PATTERN,
    RDMA_KEYS,
    Bundle,
    Document,
    ManifestError,
    ManifestErrors,
    Metadata,
    StrictModel,
)
from gpupool.manifests.bundle import build, check_references, load_bundle
from gpupool.manifests.cluster import (
    ClusterSpec,
    GPUSpec,
    NodeGroupSpec,
    NodeSpec,
    PoolSpec,
    TaintSpec,
    TopologySpec,
    build_nodes,
    build_pool,
)
from gpupool.manifests.documents import (
    MAX_TEXT_DEPTH,
    SPECS,
    collect_documents,
    load_files,
    parse_documents,
    unstorable_text,
    validate_document,
)
from gpupool.manifests.queues import (
    PreemptionSpec,
    PriorityClassSpec,
    QueueSpec,
    QuotaSpec,
    build_queue,
    default_priority_classes,
)
from gpupool.manifests.workloads import (
    GangSpec,
    PodGroupSpec,
    TolerationSpec,
    WorkloadSpec,
    WorkloadTopologySpec,
    build_workload,
)

__all__ = [
    "API_VERSION",
    "GFD_MEMORY",
    "GFD_PRODUCT",
    "HAMI_CORES",
    "HAMI_MEM",
    "KAI_FRACTION",
    "KAI_MEMORY",
    "KINDS",
    "KUEUE_QUEUE_LABEL",
    "MAX_TEXT_DEPTH",
    "NAME_PATTERN",
    "RDMA_KEYS",
    "SPECS",
    "Bundle",
    "ClusterSpec",
    "Document",
    "GPUSpec",
    "GangSpec",
    "ManifestError",
    "ManifestErrors",
    "Metadata",
    "NodeGroupSpec",
    "NodeSpec",
    "PodGroupSpec",
    "PoolSpec",
    "PreemptionSpec",
    "PriorityClassSpec",
    "QueueSpec",
    "QuotaSpec",
    "StrictModel",
    "TaintSpec",
    "TolerationSpec",
    "TopologySpec",
    "WorkloadSpec",
    "WorkloadTopologySpec",
    "build",
    "build_nodes",
    "build_pool",
    "build_queue",
    "build_workload",
    "check_references",
    "collect_documents",
    "default_priority_classes",
    "load_bundle",
    "load_files",
    "parse_documents",
    "unstorable_text",
    "validate_document",
]
