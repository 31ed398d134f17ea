"""The fake Kubernetes API server fixture shared by the Kubernetes tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.kube.fake import FakeApiServer


@pytest.fixture
def fake_server(tmp_path: Path) -> Iterator[FakeApiServer]:
    """A started ``FakeApiServer`` (controllers and kubelet on, time scaled down 100x, CRDs for
    PyTorchJob and JobSet preloaded) with a kubeconfig at ``tmp_path / 'kubeconfig'``
    (``srv.kubeconfig`` holds the path)."""
    srv = FakeApiServer(time_scale=0.01, bookmark_interval_s=0.2, preload_crds=True)
    srv.start()
    srv.write_kubeconfig(tmp_path / "kubeconfig")
    try:
        yield srv
    finally:
        srv.stop()
