"""The Kubernetes backend: gpupool as the scheduler of the pods it manages.

Map, by part (each module is one idea; tests/test_readme_layout.py checks every module here is
named, and every name is a module):

- translation, pure (objects in, values out): ``workloads`` (Jobs, Pods, PyTorchJobs, JobSets,
  Deployments, StatefulSets -> gpupool Workloads), ``translate`` (one reading a module: each
  kind's pod groups and gang minimum, pod templates -> resources, GPU product names, HAMi's
  device register, Kueue's partial admission of Jobs, which slot a pod fills), ``gangs``,
  ``schedulers`` (which scheduler an object's pods go to), ``source_keys`` (a pod's top owner),
  ``outcomes`` (how a run ended), ``annotations`` (what a bind writes on a pod, gpupool's keys
  and HAMi's), ``kubelet_status``
- inventory: ``inventory`` (node objects -> ``Node`` and devices), ``nodes`` (rebuilt where
  something changed), ``accelerators`` (Ascend NPUs, AMD GPUs), ``exclusive`` (no GPU held twice)
- the connection: ``client`` (the API connection, shared with the install and the CLI)
- the runtime: ``runtime`` (what runs against the cluster, one part a module: list + watch caches,
  the indexes over them, the binder, the evictor, leader election, the thread each part loops on)
- the adapters of the service's ports: ``adapters`` (one part a module: ``KubernetesBackend``,
  built by ``gpupool.composition.make_backend`` or by ``wiring`` for ``gpupool serve --backend
  kubernetes``, with its runs, the admission record on an owner, recovery after a restart,
  elastic serving and shrinking gangs, consolidation moves; and what flows back to the cluster:
  kubectl-created workloads become submissions, ResourcePool and Queue objects, pod conditions
  and Events from the controller's reasons, Workload status mirrors)
- clusters to run against: ``fake`` (a Kubernetes API server for tests and demos, ``gpupool kube
  fake``), ``nodeagent`` (a kubelet of simulated GPU nodes), ``realcluster`` (a real local control
  plane) and ``kueue_local`` (kube-scheduler and Kueue beside it)

Why the translation is pure (objects in, values out): the same functions serve the live
backend, the restart path (rebuild from bound pods) and the tests, with no cluster needed.
"""
