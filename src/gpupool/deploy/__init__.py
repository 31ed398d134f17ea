"""Everything needed to run gpupool on a Kubernetes cluster, generated from Python.

Why generated: the CRD schemas come from the manifest models and the plain manifests under
``deploy/manifests`` are the Helm chart's objects at its default values; tests compare the
committed files with the generators' output, so neither can drift. ``gpupool deploy`` prints them.
"""
