#!/usr/bin/env bash
# One lent GPU's checks, as one prepared command (a session gets minutes of device time, not hours).
#   tests    the GPU-only tests: CUDA-graph steps against eager ones (tests/engine/test_cuda_graphs.py);
#   kernels  bench/gpu_check.py: the Triton kernels compiled for the chip, against the torch reference at
#            llama-3-8b attention sizes, timed against SDPA, and a decode vs 64-node verify runner step;
#   suite    `specdec bench` on dummy:llama-3-8b (random weights, real shapes) in fp32 with the oracle drafter
#            at alpha 0.8 (plain decode and a chain of 5, interleaved), with CUDA graphs (the default);
#   eager    the same suite with --no-cuda-graphs.
# Usage, from the repository root (no install needed):
#   OUT=/some/dir bash bench/gpu_session.sh [step ...]      # default: tests kernels suite eager
#   KERNEL_BUDGET_S=150 sets gpu_check.py's time budget.
# Writes at most 7 files to $OUT (default bench/results/gpu_session): session.log, gpu_check.log,
# gpu_check_cuda.json, suite_{graphs,eager}/suite.{md,json}. Exits non-zero if any step failed.
set -uo pipefail
out=${OUT:-bench/results/gpu_session}
steps=${*:-tests kernels suite eager}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
log="$out/session.log"
failed=0
{
    nvidia-smi -L
    python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__, torch.cuda.get_device_name())"
} 2>&1 | tee -a "$log"
suite() {  # $1: output folder name, then extra `specdec bench` options
    local name=$1
    shift
    timeout 300 python3 -m specdec.cli bench --device cuda --target dummy:llama-3-8b --dtype float32 \
        --methods 'none;oracle:alpha=0.8|chain:k=5' --max-new-tokens 128 --prompts-per-category 1 --no-plots \
        --out "$out/$name" "$@" 2>&1 | tee -a "$log" | tail -12
    return "${PIPESTATUS[0]}"
}
for step in $steps; do
    echo "== $step" | tee -a "$log"
    case $step in
        tests) timeout 300 python3 -m pytest -q -p no:cacheprovider tests/engine/test_cuda_graphs.py 2>&1 \
                   | tee -a "$log" | tail -15; rc=${PIPESTATUS[0]} ;;
        kernels) timeout 450 python3 bench/gpu_check.py --budget-s "${KERNEL_BUDGET_S:-150}" \
                     --out "$out/gpu_check_cuda.json" 2>&1 | tee "$out/gpu_check.log" | tail -8; rc=${PIPESTATUS[0]} ;;
        suite) suite suite_graphs; rc=$? ;;
        eager) suite suite_eager --no-cuda-graphs; rc=$? ;;
        *) echo "unknown step $step"; rc=2 ;;
    esac
    echo "== $step exit $rc" | tee -a "$log"
    [ "$rc" = 0 ] || failed=1
done
exit $failed
