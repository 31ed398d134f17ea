"""gpupool's service ports adapted to Kubernetes: the backend the controller drives, and what
flows between the service and the cluster's objects.

The adapter of the backend port:

- ``backend``: ``KubernetesBackend`` (built by ``gpupool.composition.make_backend``, or by
  ``gpupool.kube.wiring`` for ``gpupool serve --backend kubernetes``); its parts are fields:
- ``admission``: ``OwnerAdmission``, the admission record on an owner and a partially admitted
  Job's counts, written on start and taken back on stop and forget
- ``runs``: ``KubeRun``, one admitted workload as the backend carries it out
- ``recovery``: what runs, after a restart (the recorded admissions and the bound pods)
- ``elastic``, ``elastic_runs`` and ``shrink``: elastic serving (a base and its extras over one
  owner's pods) and shrinking gangs
- ``moves``: consolidation, an eviction plus a reserved re-bind

What flows back to the cluster, and from it to the service:

- ``source`` (kubectl-created workloads become submissions) with ``source_policy``
- ``config_source``: ResourcePool and Queue objects kept in the cluster
- ``status``: pod conditions and Events from the controller's reasons; ``waiting`` (why a
  workload waits, as a value) and ``mirror`` (Workload status mirrors)

Why a package: these are the modules that implement or call a port of ``gpupool.service``. Below
them sit the pure translation (``gpupool.kube.translate``, ``gpupool.kube.workloads``,
``gpupool.kube.inventory``) and the runtime (``gpupool.kube.runtime``), which import nothing from
here; ``gpupool.kube.wiring`` puts the parts together for ``gpupool serve``.
"""
