#!/usr/bin/env bash
# The GPU run behind BENCHMARKS.md, as one command on the device machine (results in $OUT):
#   bash benchmarks/run_gpu.sh
# Needs torch + wrapt (the H200 image has both) and the OpenTelemetry wheels in .whl/ (BENCHMARKS.md
# says how to fetch them); without .whl/ the packages must already be importable.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
# NVLink multicast stays off in every multi-GPU run on shared hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || exit 1
fi
{ nvidia-smi; nvidia-smi topo -m; lscpu | head -20; } > "$OUT/machine.txt" 2>&1
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count())')
echo "GPUs: $NGPU"
if [ "${SKIP_NCCL:-0}" != 1 ] && [ "$NGPU" -ge 2 ]; then
  timeout 240 python3 benchmarks/gpu_nccl.py --out "$OUT" 2>&1 | tee "$OUT/gpu_nccl.log"
fi
if [ "${SKIP_CLOCK:-0}" != 1 ]; then
  CUDA_VISIBLE_DEVICES=${BENCH_GPU:-0} timeout 120 python3 benchmarks/gpu_clock.py --out "$OUT" > "$OUT/gpu_clock.log" 2>&1
  tail -n 40 "$OUT/gpu_clock.log"
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  CUDA_VISIBLE_DEVICES=${BENCH_GPU:-0} timeout 480 python3 benchmarks/gpu_bench.py --out "$OUT" ${BENCH_ARGS:-} 2>&1 \
    | tee "$OUT/gpu_bench.log"
fi
ls -la "$OUT"
