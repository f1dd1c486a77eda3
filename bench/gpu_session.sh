#!/usr/bin/env bash
# One lent GPU's checks, as one prepared command (a session gets minutes of device time, not hours):
#   1. bench/gpu_check.py: the Triton kernels compiled for the real chip, against the torch reference at
#      llama-3-8b attention sizes, timed against SDPA, and one decode vs 64-node verify step of the runner;
#   2. `specdec bench` end to end on dummy:llama-3-8b (random weights, real shapes, bf16) with the oracle
#      drafter at alpha 0.8: plain decode, a chain of 5 and a 32-node tree, interleaved in one run.
# Usage (from the repository root, no install needed): OUT=/some/dir bash bench/gpu_session.sh [check_budget_s]
# Writes at most 7 files to $OUT (default bench/results/gpu_session); exits non-zero if a check failed.
set -uo pipefail
out=${OUT:-bench/results/gpu_session}
budget=${1:-150}
mkdir -p "$out/suite"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
    nvidia-smi -L
    python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__, torch.cuda.get_device_name())"
} 2>&1 | tee "$out/env.txt"
timeout $((budget + 150)) python3 bench/gpu_check.py --budget-s "$budget" --out "$out/gpu_check_cuda.json" 2>&1 \
    | tee "$out/gpu_check.log"
check=${PIPESTATUS[0]}
timeout 240 python3 -m specdec.cli bench --device cuda --target dummy:llama-3-8b \
    --methods 'none;oracle:alpha=0.8|chain:k=5;oracle:alpha=0.8|dynamic:depth=6,topk=4,budget=32' \
    --max-new-tokens 128 --prompts-per-category 1 --no-plots --out "$out/suite" 2>&1 | tee "$out/suite.log"
suite=${PIPESTATUS[0]}
echo "gpu_check exit $check, suite exit $suite"
[ "$check" = 0 ] && [ "$suite" = 0 ]
