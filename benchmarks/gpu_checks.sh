#!/usr/bin/env bash
# The book's GPU commands, run on one CUDA GPU: chapter 13's (prepare -> train --device cuda
# --dtype bfloat16 -> an interruption and --resume -> torchrun -> sample), chapter 10's bf16 check,
# the CPU's bf16 against float32 for Muon's Newton-Schulz (issue: which dtype is fast depends on
# the CPU), and benchmarks/gpu_throughput.py beside nanoGPT. Each step logs to $OUT/NAME.log and
# the step's status goes to $OUT/summary.txt; a failing step does not stop the others.
#
# Usage (from the repository root, on a machine with a GPU):
#   GPU_DATA=folder-with-tinyshakespeare.txt-and-gpt2/ NANOGPT_DIR=nanoGPT-checkout \
#   OUT=results-folder bash benchmarks/gpu_checks.sh
set -uo pipefail

OUT=${OUT:-/tmp/gpu_checks}
WORK=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src TINYGPT_DATA=${GPU_DATA:?set GPU_DATA}
PY=${PYTHON:-python3}
MODEL=(--n-layer 12 --n-head 12 --n-embd 768 --block-size 1024)
RUN=(--device cuda --dtype bfloat16 "${MODEL[@]}" --batch-size 16 --max-iters 60
     --eval-interval 20 --eval-iters 10 --save-every 20 --warmup-iters 10)

step() {  # step NAME COMMAND...: run it, log it, record its status and seconds
    local name=$1; shift
    local t0=$SECONDS
    { echo "\$ $*"; "$@"; } >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
    return $rc
}

step machine bash -c 'nvidia-smi; lscpu; '"$PY"' -c "import torch; print(torch.__version__, torch.version.cuda)"'

# chapter 13: a folder of text files (tinyshakespeare cut into 40 files of consecutive lines)
"$PY" - "$TINYGPT_DATA/tinyshakespeare.txt" "$WORK/corpus" <<'EOF'
import sys
from pathlib import Path
lines = Path(sys.argv[1]).read_text(encoding="utf-8").splitlines(keepends=True)
out = Path(sys.argv[2]); out.mkdir()
n = len(lines) // 40 + 1
for i in range(40):
    (out / f"part_{i:02d}.txt").write_text("".join(lines[i * n:(i + 1) * n]), encoding="utf-8")
EOF
step prepare "$PY" -m tinygpt prepare "$WORK/corpus" --out "$WORK/shards" --tokenizer gpt2 --workers 8
step train_straight "$PY" -m tinygpt train --data "$WORK/shards" --out "$WORK/straight" "${RUN[@]}"
# an interruption: stop the same run once its checkpoint of step 20 is written, then --resume
"$PY" -m tinygpt train --data "$WORK/shards" --out "$WORK/run" "${RUN[@]}" \
    >"$OUT/train_interrupted.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
    [[ -f "$WORK/run/checkpoint.json" ]] && break
    kill -0 "$pid" 2>/dev/null || break  # it ended (or failed) before saving
    sleep 0.2
done
kill -KILL "$pid" 2>/dev/null; wait "$pid"
echo "train_interrupted rc=$? (killed after its first checkpoint)" | tee -a "$OUT/summary.txt"
step train_resume "$PY" -m tinygpt train --data "$WORK/shards" --out "$WORK/run" "${RUN[@]}" --resume
step torchrun torchrun --standalone --nproc_per_node=1 -m tinygpt train --data "$WORK/shards" \
    --out "$WORK/ddp" --device cuda --dtype bfloat16 "${MODEL[@]}" --batch-size 16 \
    --max-iters 20 --eval-interval 20 --eval-iters 5 --warmup-iters 5
step sample "$PY" -m tinygpt sample --out "$WORK/run" --device cuda --prompt "ROMEO:" \
    --max-new-tokens 120 --seed 1
"$PY" - "$WORK" "$OUT/histories.json" <<'EOF'
import json, sys
from pathlib import Path
out = {}
for name in ("straight", "run", "ddp"):
    manifest = Path(sys.argv[1]) / name / "checkpoint.json"
    if manifest.is_file():
        meta = json.loads(manifest.read_text())
        out[name] = [r for r in meta.get("history", []) if "val_loss" in r or r.get("step") == 0]
Path(sys.argv[2]).write_text(json.dumps(out, indent=1))
print(json.dumps(out)[:2000])
EOF

# chapter 10: bf16 on this GPU, natively (not emulated)
step bf16 "$PY" -c "import torch; print('bf16 native:', torch.cuda.is_bf16_supported(including_emulation=False), torch.cuda.get_device_capability())"

# Muon's Newton-Schulz on this machine's CPU: bfloat16 against float32 (1 thread and all)
step cpu_newton_schulz "$PY" - <<'EOF'
import json, os, statistics, time, torch
from tinygpt.muon import NS_COEFFICIENTS, NS_EPS, NS_STEPS

def newton_schulz(g, dtype):  # the package's iteration, in the dtype given
    a, b, c = NS_COEFFICIENTS
    x = g.to(dtype)
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / (x.norm() + NS_EPS)
    for _ in range(NS_STEPS):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if tall else x

rows = []
for threads in (1, os.cpu_count()):
    torch.set_num_threads(threads)
    for shape in ((128, 512), (768, 3072)):
        g = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
        for dtype in (torch.float32, torch.bfloat16):
            newton_schulz(g, dtype)  # warm-up
            times = []
            for _ in range(5):
                t0 = time.perf_counter(); newton_schulz(g, dtype); times.append(time.perf_counter() - t0)
            rows.append({"threads": threads, "shape": shape, "dtype": str(dtype),
                         "ms": round(1000 * statistics.median(times), 3)})
            print(rows[-1])
flags = open("/proc/cpuinfo").read()
print(json.dumps({"avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags,
                  "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "rows": rows}))
EOF

step throughput "$PY" benchmarks/gpu_throughput.py --compile --out "$OUT/gpu_throughput.json"
cat "$OUT/summary.txt"
