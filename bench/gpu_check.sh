#!/usr/bin/env bash
# The GPU checks, in one run of at most about 8 minutes (docs/benchmarks.md has the command):
#   1. pytest -m gpu        every op numpy vs CuPy (forward, backward, float64 gradchecks on the GPU),
#                           each registered fused kernel against its op's formula, a short GPT run
#                           on CPU and GPU with matching losses
#   2. bench/bench_step.py   one training step of nanoGPT's GPU Shakespeare config: tinyattn (CuPy)
#                           against PyTorch eager CUDA, median ms/step, tokens/s, memory pools
#   3. python -m train      that config trained on tiny Shakespeare for the time left (<= 300 s)
# Each stage runs even if an earlier one failed. The exit code is the number of failed stages.
#
#   bash bench/gpu_check.sh [OUT_DIR]     results go to OUT_DIR (or $OUT; default gpu_out): 8 files
#
# The data: tiny Shakespeare where `python data/shakespeare_char.py` puts it
# (data/shakespeare_char/input.txt), or the file that $DATA names.
# SMOKE=1 DEVICE=cpu runs the same flow with toy sizes on a CPU, to test this script itself.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"   # a bare GPU machine may run the checkout uninstalled
export PYTHONUNBUFFERED=1
OUT=${1:-${OUT:-gpu_out}}
DEVICE=${DEVICE:-cuda}
SMOKE=${SMOKE:-0}
TOTAL_S=${TOTAL_S:-480}                   # the whole script: about 8 minutes
DATA=${DATA:-data/shakespeare_char/input.txt}
START=$(date +%s)
elapsed() { echo $(( $(date +%s) - START )); }
mkdir -p "$OUT"
: > "$OUT/status.txt"
note() { echo "$*" | tee -a "$OUT/status.txt"; }
FAILED=0

# ---- 0. the machine -------------------------------------------------------------------
{
    date -u
    nvidia-smi || echo "(no nvidia-smi)"
    python3 --version
    python3 -c "import numpy; print('numpy', numpy.__version__)"
    python3 -c "import cupy; rt = cupy.cuda.runtime; print('cupy', cupy.__version__, '| CUDA runtime', rt.runtimeGetVersion(), '| driver', rt.driverGetVersion())" || true
    python3 -c "import torch; print('torch', torch.__version__, '| CUDA', torch.version.cuda, '| GPU', torch.cuda.is_available() and torch.cuda.get_device_name(0))" || true
    git rev-parse HEAD 2>/dev/null || echo "(not a git checkout)"
    git status --short 2>/dev/null | head -20
} > "$OUT/env.txt" 2>&1

# ---- 1. tests -------------------------------------------------------------------------
timeout 240 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider --continue-on-collection-errors tests/ \
    2>&1 | tee "$OUT/pytest.log" | tail -15
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 0 ] && [ "$DEVICE" != cpu ] && ! tail -1 "$OUT/pytest.log" | grep -q passed; then
    rc=99                                 # all skipped: CuPy or the GPU was not found
fi
if [ "$rc" -eq 0 ]; then note "1 pytest -m gpu: PASS ($(tail -1 "$OUT/pytest.log"))"
else note "1 pytest -m gpu: FAIL (exit $rc; 124 = over its 240 s, 99 = no GPU test ran) $(tail -1 "$OUT/pytest.log")"; FAILED=$((FAILED + 1)); fi
note "  at $(elapsed) s"

# ---- 2. benchmark ---------------------------------------------------------------------
BENCH_ARGS="--device $DEVICE --budget_s 80"
[ "$SMOKE" = 1 ] && BENCH_ARGS="$BENCH_ARGS --config tiny --blocks 2 --steps 2 --warmup 1"
timeout 120 python3 bench/bench_step.py $BENCH_ARGS --out "$OUT/bench.json" > "$OUT/bench.log" 2>&1
rc=$?
if [ "$rc" -eq 0 ] && [ -s "$OUT/bench.json" ]; then
    note "2 benchmark: PASS $(python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))['results']
print('; '.join(f\"{k} {v['ms_per_step_median']} ms/step, {v['tokens_per_s']:.0f} tok/s\" for k, v in r.items()))
" "$OUT/bench.json")"
else note "2 benchmark: FAIL (exit $rc; 124 = over its 120 s): $(tail -3 "$OUT/bench.log" | tr '\n' ' ')"; FAILED=$((FAILED + 1)); fi
note "  at $(elapsed) s"

# ---- 3. training on tiny Shakespeare ----------------------------------------------------
# How many iterations fit: the benchmark just timed a training step of this very config
# (same batch, block, model and dropout; the loop adds only host batch sampling and a loss
# read every 10 steps). The stage gets what is left of TOTAL_S less 20 s of slack, at most
# 300 s. From that come ~15 s of fixed costs (imports, reading and encoding 1.1 M characters,
# init and copy to the GPU; CuPy's kernels are already compiled and cached on disk by stages
# 1-2), and 6 evaluations (step 0, every N/5, the end) of 2 x 20 forward passes at about a
# third of a step each: ~80 steps' worth. Steps are counted 10% slower than benchmarked for
# the loop's own overhead and checkpoint saves. N is rounded down to a multiple of 50 and
# kept in [100, 5000]. Without a benchmark result a step is assumed to take 150 ms.
left=$(( TOTAL_S - $(elapsed) - 20 ))
[ "$left" -gt 300 ] && left=300
read -r N E W < <(python3 - "$OUT/bench.json" "$left" "$SMOKE" <<'EOF'
import json, sys
path, left, smoke = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
try:
    ms = json.load(open(path))["results"]["tinyattn"]["ms_per_step_median"]
except Exception:
    ms = 150.0
step_s = 1.1 * ms / 1000.0
n = int((left - 15.0) / step_s) - 80
n = max(100, min(5000, n // 50 * 50))
if smoke:
    n = 20
print(n, max(10, n // 5), min(100, n))
EOF
)
note "3 training: N=$N iterations, eval every $E, limit ${left} s"
RUN=$(mktemp -d "${TMPDIR:-/tmp}/tinyattn_gpu_run.XXXXXX")   # ckpt.npz is large: keep it out of $OUT
if [ "$SMOKE" = 1 ]; then MODEL="--n_layer 1 --n_head 2 --n_embd 16 --block_size 16 --batch_size 4 --eval_iters 2"
else MODEL="--n_layer 6 --n_head 6 --n_embd 384 --block_size 256 --batch_size 64 --eval_iters 20"; fi
if [ ! -s "$DATA" ]; then
    note "3 training: FAIL: $DATA is missing (run: python data/shakespeare_char.py, or set DATA=FILE)"; FAILED=$((FAILED + 1))
elif [ "$left" -lt 60 ]; then
    note "3 training: FAIL: only $left s left of TOTAL_S=$TOTAL_S"; FAILED=$((FAILED + 1))
else
    # no --quiet: the eval lines (train and val loss) reach train.log as they happen; --sample_tokens 0
    timeout -s INT -k 30 "$left" python3 -m train --data "$DATA" --device "$DEVICE" $MODEL \
        --dropout 0.2 --learning_rate 1e-3 --min_lr 1e-4 --beta2 0.99 --warmup_iters "$W" \
        --max_iters "$N" --lr_decay_iters "$N" --eval_interval "$E" --sample_tokens 0 \
        --out_dir "$RUN" > "$OUT/train.log" 2>&1
    rc=$?
    cp "$RUN/summary.json" "$RUN/log.csv" "$OUT/" 2>/dev/null
    if [ "$rc" -eq 0 ] && [ -s "$OUT/summary.json" ]; then
        note "3 training: PASS $(python3 -c "
import json, sys
s = json.load(open(sys.argv[1]))
goal = 'met' if s['best_val_loss'] <= 1.48 else 'not met'
print(f\"{s['iters']} iters in {s['wall_s']} s, {s['tokens_per_s']} tok/s, val loss {s['val_loss']:.4f}, \"
      f\"best {s['best_val_loss']:.4f} (goal <= 1.48: {goal}; nanoGPT: 1.47 after 5000 iters)\")
" "$OUT/summary.json")"
    else note "3 training: FAIL (exit $rc; 130 = stopped at the limit): $(tail -2 "$OUT/train.log" | tr '\r\n' '  ' | tail -c 300)"
        FAILED=$((FAILED + 1)); fi
fi
rm -rf "$RUN"
note "done: $FAILED stage(s) failed, $(elapsed) s in all"
exit "$FAILED"
