"""A fake Kubernetes API server for tests, demos and the benchmark (``gpupool kube fake``).

Served over real HTTP on 127.0.0.1 (uvicorn in a background thread), in memory, faithful where
a scheduler or kubectl depends on the real server; ``docs/kubernetes-fake.md`` lists what it
keeps and what it leaves out.

Resources are named by their *resource key*: the plural for the core group (``pods``,
``nodes``, ``events``), else ``plural.group`` (``jobs.batch``, ``leases.coordination.k8s.io``,
``pytorchjobs.kubeflow.org``, ``jobsets.jobset.x-k8s.io``). ``FakeApiServer.get/list/delete/
update/patch`` take that key first; ``create(obj)`` finds it from apiVersion and kind
(``FakeApiServer.resource_of(obj)``); cluster-scoped objects have namespace ``""``.

Map (one idea per module):

- ``server``       ``FakeApiServer``: lifecycle, kubeconfig, in-process access, node builders
- ``resources``    the served types (built-ins, CRDs); ``discovery`` their documents and OpenAPI
- ``storage``      objects, the global resourceVersion, the watch history, listeners, ``Stats``
- ``ops``          create/update/patch/delete rules (conflicts, finalizers, grace, cascades);
  ``defaults`` what create fills in; ``patch`` the three patch kinds
- ``subresources`` ``pods/binding`` and ``pods/eviction``
- ``http``         the ASGI app and its routing; ``watch`` the streams; ``tables`` kubectl's Tables;
  ``selectors`` label and field selectors; ``faults`` fault injection; ``errors`` Status bodies
- ``runtime``      where the simulators run; ``controllers``/``training``/``owners`` the
  controllers, ``operators`` registers them all; ``kubelet`` and ``hami`` the node side;
  ``nodes`` Node objects
- ``selfbench``    what a bind costs the server (``python -m gpupool.kube.fake.selfbench``)
"""

from gpupool.kube.fake.errors import ApiError
from gpupool.kube.fake.faults import FaultConfig
from gpupool.kube.fake.server import FakeApiServer

__all__ = ["ApiError", "FakeApiServer", "FaultConfig"]
