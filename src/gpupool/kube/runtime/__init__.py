"""The machinery that keeps the Kubernetes backend in step with a cluster while it runs.

- ``informer``: list + watch caches of the objects the backend reads (a cycle never lists)
- ``tracker``: indexes over those caches, kept by listeners (a workload's pods, each node's
  occupied devices)
- ``binder``: binds pods to the devices the engine chose, in parallel across nodes
- ``evictor``: acts on owners and pods: admit (unsuspend and record the placement), preempt
  (re-suspend, or disrupt and delete), Events
- ``lease``: leader election on a Lease, so that only one replica binds or evicts
- ``loop``: the background thread each adapter part (source, status writer, configuration
  source) runs its passes on

Why a package: these are the parts with threads, watches and writes to the cluster, below the
adapters of the service's ports (``gpupool.kube.adapters``: the backend and the runs it keeps)
and beside the pure translation (``gpupool.kube.translate``). The API connection they all use,
``gpupool.kube.client``, stays outside: the install (``gpupool.deploy``) and the CLI use it too, with no runtime.
"""
