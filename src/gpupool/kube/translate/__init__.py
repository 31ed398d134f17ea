"""Kubernetes objects read as gpupool values, pure (objects in, values out), one reading a module.

- ``kinds``: how each workload kind (Job, PyTorchJob, JobSet, Deployment, StatefulSet) lays out
  its pod groups and says its gang minimum
- ``resources``: a pod template's requests as a pod group's resources (whole GPUs, HAMi and KAI
  shares), its tolerations and node selector
- ``partial``: Kueue's partial admission of Jobs (the patch that admits k pods, and its restore)
- ``slots``: which slot of its group a pod fills
- ``models``: GPU product names as gpupool model names
- ``hami``: HAMi's node device register as devices

Why a package of its own: these readings need no cluster, no client and no backend, so the live
backend, the restart path and the tests share them; ``gpupool.kube.workloads`` and
``gpupool.kube.inventory`` put them together into Workloads and Nodes.
"""
