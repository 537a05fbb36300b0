#!/bin/bash
# On the GPU machine, from the repository root, with the folder build.py made:
#   bash benchmarks/gpu_sglang/run.sh SUITE...   (correct | seed | overhead; see device.py)
# Installs SGLang 0.5.23 and its missing dependencies under /tmp/site, the sgl-probe wheel under
# /tmp/probe (only the probe-on servers see it), the benchmark stand-ins next to SGLang, then runs
# device.py. Results and logs go to $OUT (default: a new temp dir).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
CARRY=${CARRY:-$HERE/../../.carry/gpu_sglang}
OUT=${OUT:-$(mktemp -d)}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# NVLink multicast stays off on shared machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The stand-in sgl_kernel has no version to check; SGLang's JIT kernels are cached across servers.
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 SGLANG_JIT_CACHE_DIR=/tmp/sgljit
# SGLang's shipped Rust radix-tree core is built against a newer torch than the machine's.
export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
# "Decode batch [N]": SGLang's per-batch log lines carry the iteration number.
export SGLANG_LOG_FORWARD_ITERS=1
export GPU_BENCH_SITE=/tmp/site GPU_BENCH_PROBE=/tmp/probe GPU_BENCH_PROBE_REF=/tmp/probe_ref
t0=$(date +%s)
if [ ! -d /tmp/site/sglang ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$CARRY"/whl/*.whl 2>&1 | grep -v "Target directory" | tail -3
  tar -xJf "$CARRY"/sglang-0.5.23.tar.xz -C /tmp/site || exit 3
  cp -r "$HERE"/standins/* /tmp/site/
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/probe "$CARRY"/probe/*.whl 2>&1 | grep -v "Target directory" | tail -3
  [ -d "$CARRY"/probe_ref ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/probe_ref "$CARRY"/probe_ref/*.whl 2>&1 | grep -v "Target directory" | tail -3
  [ -f "$CARRY"/jitcache.tgz ] && mkdir -p /tmp/sgljit && tar -xzf "$CARRY"/jitcache.tgz -C /tmp/sgljit
fi
echo "[run.sh] installed in $(( $(date +%s) - t0 ))s"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT"/machine.txt 2>&1
# The host's CPU: the probe's µs per step and a launch-bound server's speed follow it (h100-4 against h100-5).
echo "host cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cpus" >> "$OUT"/machine.txt
# PYTHONSAFEPATH: from the checkout, -c would import the checkout's sgl_probe instead of the wheel's.
PYTHONSAFEPATH=1 PYTHONPATH=/tmp/probe:/tmp/site python3 -c 'import torch, sglang, sgl_probe, sgl_probe.hotpath as h; print("torch", torch.__version__, "cuda", torch.version.cuda, "sglang", sglang.__version__, "sgl_probe", sgl_probe.__version__, "from", sgl_probe.__file__, "hot path", h.name(h.load()))' >> "$OUT"/machine.txt 2>&1
cat "$OUT"/machine.txt
python3 "$HERE"/device.py "$@" --carry "$CARRY" --out "$OUT"
rc=$?
[ -d /tmp/sgljit ] && tar -czf "$OUT"/jitcache.tgz -C /tmp/sgljit . 2>/dev/null
exit $rc
