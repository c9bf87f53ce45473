#!/usr/bin/env bash
# One device call: GPU tests, the ring demo on every GPU (NCCL), the ring and single-GPU benchmarks.
# Usage (on a 2- or 4-GPU machine, from the repo root): OUT=dir bash benchmarks/gpu_session.sh [steps...]
# steps: tests demo ring softmax attention (default: all). Logs go to $OUT/<step>.log.
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-out}; mkdir -p "$OUT"
NPROC=${NPROC:-$(nvidia-smi -L | wc -l)}   # ranks of the ring steps: every GPU
steps=${*:-tests demo ring softmax attention}
quiet() { grep -v -E '^W[0-9]{4} |\*{10}|OMP_NUM_THREADS|^$'; }
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
for step in $steps; do
  echo "=== $step $(date -u +%FT%TZ)"
  case $step in
    tests) timeout ${TESTS_TIMEOUT:-240} python3 -m pytest -m gpu -q -x -p no:cacheprovider -n 4 ${TESTS:-} 2>&1 |
             tee "$OUT/tests-full.log" | grep -v -E "^frame #|^$" | tail -40 ;;
    demo) timeout 150 torchrun --nproc-per-node $NPROC launch/ring_demo.py 2>&1 | quiet
          timeout 90 torchrun --nproc-per-node $NPROC launch/ring_demo.py --dtype float32 --seqlen 8192 --layout stripe 2>&1 | quiet ;;
    ring) timeout ${RING_TIMEOUT:-200} torchrun --nproc-per-node $NPROC launch/bench_ring.py --seqlens 32768,131072 2>&1 | quiet ;;
    softmax) timeout 150 python3 launch/bench_softmax.py --quick 2>&1 ;;
    attention) timeout 200 python3 launch/bench_attention.py --quick 2>&1 ;;
  esac 2>&1 | tee "$OUT/$step.log"
done
echo "=== done $(date -u +%FT%TZ)"
