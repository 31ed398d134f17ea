#!/usr/bin/env bash
# On a host with an NVIDIA GPU: start the local backend, run two fractional workloads that each try
# to allocate beyond their GPU memory limit, and a whole-GPU workload that reports what it sees.
# Prints, for each fractional pod, what it could allocate against its limit (CUDA MPS enforces
# CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), and the whole-GPU pod's CUDA_VISIBLE_DEVICES and devices.
#
#   bench/gpu-check.sh            # needs nvidia-smi, nvidia-cuda-mps-control and the driver
#
# The pods use the CUDA driver API through ctypes (libcuda.so.1, present wherever the driver is),
# so no CUDA toolkit or framework is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PORT=${PORT:-18431}
STATE=$(mktemp -d /tmp/gpupool-gpu-check.XXXXXX)
SERVER="http://127.0.0.1:$PORT"
export GPUPOOL_TOKEN_FILE="$STATE/admin-token"
gp() { "$PY" -c "from gpupool.cli import main; main()" "$@"; }

command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this check needs an NVIDIA GPU host" >&2; exit 2; }
nvidia-smi --query-gpu=index,name,memory.total,uuid --format=csv,noheader
command -v nvidia-cuda-mps-control >/dev/null || echo "note: no nvidia-cuda-mps-control: fractional pods will be refused"

gp serve --backend local --state-dir "$STATE" --port "$PORT" --tick 0.2 >"$STATE/server.log" 2>&1 &
SRV=$!
trap 'kill $SRV 2>/dev/null || true; echo quit | CUDA_MPS_PIPE_DIRECTORY=$STATE/mps/pipe nvidia-cuda-mps-control 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -fs "$SERVER/healthz" >/dev/null 2>&1 && break; sleep 0.2; done
head -n 8 "$STATE/server.log"

# allocate 256 MiB blocks until the driver refuses; print the total against the limit
ALLOC='
import ctypes, os
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
cu.cuDeviceGet(ctypes.byref(dev), 0)
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
got, ptr = 0, ctypes.c_uint64()
while got < 200 * 1024 and cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(256 << 20)) == 0:
    got += 256
env = os.environ
name, limit = env["GPUPOOL_WORKLOAD"], env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "none")
share, iso = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "-"), env.get("GPUPOOL_GPU_ISOLATION", "-")
print(f"{name}: allocated {got} MiB; limit {limit}; share {share}%; isolation {iso}")
'
SEE='
import ctypes, os
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
n = ctypes.c_int(); cu.cuDeviceGetCount(ctypes.byref(n))
names = []
for i in range(n.value):
    d = ctypes.c_int(); cu.cuDeviceGet(ctypes.byref(d), i)
    buf = ctypes.create_string_buffer(100); cu.cuDeviceGetName(buf, 100, d); names.append(buf.value.decode())
visible = os.environ["CUDA_VISIBLE_DEVICES"]
print(f"whole: CUDA_VISIBLE_DEVICES={visible} sees {n.value} device(s): {names}")
'
wl() { # name, resources (flow mapping), python code
  "$PY" - "$1" "$2" "$3" >"$STATE/$1.json" <<'EOF'
import json, sys
name, res, code = sys.argv[1], sys.argv[2], sys.argv[3]
import yaml
print(json.dumps({"apiVersion": "gpupool.io/v1alpha1", "kind": "Workload", "metadata": {"name": name},
  "spec": {"queue": "default", "podGroups": [{"resources": yaml.safe_load(res), "command": [sys.executable, "-c", code]}]}}))
EOF
  gp submit -f "$STATE/$1.json" --server "$SERVER"
}
wl frac-a '{nvidia.com/gpu: 250m, nvidia.com/gpumem: 4Gi, cpu: 1, memory: 4Gi}' "$ALLOC"
wl frac-b '{nvidia.com/gpu: 250m, nvidia.com/gpumem: 8Gi, cpu: 1, memory: 4Gi}' "$ALLOC"
wl whole '{nvidia.com/gpu: 1, cpu: 1, memory: 4Gi}' "$SEE"
sleep 20
gp get workloads --server "$SERVER"
for n in frac-a frac-b whole; do gp logs "$n" --server "$SERVER" || true; done
