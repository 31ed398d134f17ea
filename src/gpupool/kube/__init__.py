"""The Kubernetes backend: gpupool as the scheduler of the pods it manages.

Map (each module is one idea):

- ``inventory``   node objects (+ HAMi's device register) -> gpupool ``Node`` and devices
- ``workloads``   Jobs, Pods, PyTorchJobs, JobSets, Deployments, StatefulSets -> gpupool Workloads
- ``annotations`` the placement written on a pod at bind time (gpupool's keys and HAMi's)
- ``fake``        a Kubernetes API server for tests and demos (``gpupool kube fake``)
- the runtime (informer cache, binder, evictor, status writer, lease) beside them
- ``status``    the status writer (pod conditions, Events, Workload mirrors: ``mirror``), from
  the controller's reasons (``waiting.Waiting``)
- ``backend``     the ``gpupool.service.backends.Backend`` port over the API; built by
  ``gpupool.composition.make_backend`` or ``wiring`` (``gpupool serve --backend kubernetes``)

Why the translation is pure (objects in, values out): the same functions serve the live
backend, the restart path (rebuild from bound pods) and the tests, with no cluster needed.
"""
