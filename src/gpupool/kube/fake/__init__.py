"""A fake Kubernetes API server for tests, demos and the benchmark (``gpupool kube fake``).

Resources are named by their *resource key*: the plural for the core group (``pods``,
``nodes``, ``events``), else ``plural.group`` (``jobs.batch``, ``leases.coordination.k8s.io``,
``pytorchjobs.kubeflow.org``, ``jobsets.jobset.x-k8s.io``). ``FakeApiServer.resource_of(obj)``
gives the key of an object from its apiVersion and kind.
"""

from gpupool.kube.fake.errors import ApiError
from gpupool.kube.fake.faults import FaultConfig
from gpupool.kube.fake.server import FakeApiServer

__all__ = ["ApiError", "FakeApiServer", "FaultConfig"]
