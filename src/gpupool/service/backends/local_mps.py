"""GPU sharing on one host (显存隔离, GPU memory isolation) through CUDA MPS.

Why MPS and nothing else: a fractional GPU is only a promise if one pod cannot take the memory
or the compute of another. On a single host without Kubernetes device plugins, the CUDA
Multi-Process Service is what the driver itself enforces: each client gets
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (its share of the SMs) and
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (an allocation beyond it fails in the client). The backend
runs the MPS control daemon (``nvidia-cuda-mps-control -d``) with its pipe and log directories
under the state directory and starts it again when it is gone.

Where the host cannot enforce a limit (no MPS binary, or devices that do not exist), a fractional
request is refused with a reason that says so; only ``--allow-unenforced`` (demos) runs it, and
then the pod, the health view and the logs say loudly that nothing is isolated.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MPS_CONTROL = "nvidia-cuda-mps-control"


@dataclass(slots=True)
class MpsControl:
    """The MPS control daemon of this backend (its directories live under ``root``)."""

    root: Path
    binary: str | None = field(default_factory=lambda: shutil.which(MPS_CONTROL))
    last_error: str = ""

    @property
    def pipe_dir(self) -> Path:
        return self.root / "pipe"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def available(self) -> bool:
        return self.binary is not None

    def _env(self) -> dict[str, str]:
        from gpupool.service.backends.local_process import base_env

        return base_env(
            {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}
        )

    def responds(self) -> bool:
        """Whether a control daemon answers on our pipe directory."""
        if self.binary is None or not (self.pipe_dir / "control").exists():
            return False
        try:
            r = subprocess.run(
                [self.binary],
                input=b"get_server_list\n",
                env=self._env(),
                capture_output=True,
                timeout=5,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return r.returncode == 0

    def ensure_running(self) -> str:
        """Start the daemon unless it answers; '' when it runs, else why it cannot."""
        if self.binary is None:
            return f"{MPS_CONTROL} was not found on this host"
        if self.responds():
            return ""
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            r = subprocess.run(
                [self.binary, "-d"], env=self._env(), capture_output=True, timeout=15, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.last_error = f"{MPS_CONTROL} -d failed: {exc}"
            return self.last_error
        if r.returncode != 0:
            self.last_error = (
                f"{MPS_CONTROL} -d exited {r.returncode}: {r.stderr.decode(errors='replace')[:200]}"
            )
            return self.last_error
        self.last_error = ""
        return ""

    def client_env(self, share_milli: int, memory_mib: int) -> dict[str, str]:
        """A fractional pod's environment: its compute share and memory limit on its one device.

        The device is ordinal 0 for the client: ``CUDA_VISIBLE_DEVICES`` names only that one."""
        return {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, min(100, share_milli // 10))),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={max(1, memory_mib)}M",
        }

    def describe(self) -> dict[str, Any]:
        return {
            "binary": self.binary,
            "pipeDirectory": str(self.pipe_dir),
            **({"lastError": self.last_error} if self.last_error else {}),
        }

    def quit(self) -> None:
        """Stop the daemon (tests, and ``gpupool serve`` shutting down cleanly never call it:
        running clients would lose their server)."""
        if self.binary is not None and self.pipe_dir.exists():
            subprocess.run(
                [self.binary], input=b"quit\n", env=self._env(), capture_output=True, timeout=10, check=False
            )


def fraction_refusal(fake: bool, mps_available: bool, allow_unenforced: bool) -> str:
    """Why a fractional GPU request cannot run isolated on this host ('' when it can, or when
    ``allow_unenforced`` says to run it anyway)."""
    if allow_unenforced:
        return ""
    if fake:
        return (
            "fractional GPUs are refused on this host: its GPUs are fake (--fake-gpus), so no "
            "GPU memory limit (显存隔离) can be enforced; serve with --allow-unenforced to run "
            "them anyway without isolation (demos only)"
        )
    if not mps_available:
        return (
            f"fractional GPUs are refused on this host: {MPS_CONTROL} (CUDA MPS) was not found, so "
            "no GPU memory limit (显存隔离) can be enforced; request whole GPUs, or install the "
            "CUDA MPS control daemon and restart gpupool serve"
        )
    return ""


__all__ = ["MPS_CONTROL", "MpsControl", "fraction_refusal"]
