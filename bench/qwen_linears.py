"""Do extra verify rows re-stream the weights? Time the 1.5B Qwen's int8 linears at R rows.

    OMP_NUM_THREADS=1 python bench/qwen_linears.py

Random int8 weights of qwen2.5-coder-1.5b's shapes (28 layers of fused q/k/v, o, fused gate/up and down, plus
the LM head: 1.54 GB, far beyond any cache), through our CPU kernel (`QLinear.forward_q8`), one thread. Each
row count is timed over the whole stack, best of 3 rounds; rows run interleaved round by round. If each tile of
weights is read once for all rows, R rows cost far less than R times one row.
"""

from __future__ import annotations

import time

import torch

from specdec.models import qlinear
from specdec.models.qlinear import QLinear

LAYERS = 28
SHAPES = [(1536, 2048), (1536, 1536), (1536, 17920), (8960, 1536)] * LAYERS + [(1536, 151936)]  # (in, out)
ROWS = (1, 2, 3, 5, 9)


def main() -> None:
    torch.set_num_threads(1)
    kernels = qlinear.kernels
    layers = [QLinear.from_linear(torch.nn.Linear(k, n, bias=False), 8) for k, n in SHAPES]
    macs = sum(k * n for k, n in SHAPES)
    acts = {r: {k: kernels.quantize(torch.randn(r, k), kernels.Q8) for k in (1536, 8960)} for r in ROWS}
    best = {r: float("inf") for r in ROWS}
    for _ in range(3):
        for r in ROWS:
            start = time.perf_counter()
            for (k, _), layer in zip(SHAPES, layers):
                layer.forward_q8(acts[r][k])
            best[r] = min(best[r], time.perf_counter() - start)
    print(f"int8 weights: {macs / 1e6:.0f} MB")
    for r in ROWS:
        print(f"{r} rows: {best[r] * 1e3:7.1f} ms  {best[r] / best[1]:.2f}x of 1 row  {r * macs / best[r] / 1e9:5.1f} GMAC/s")


if __name__ == "__main__":
    main()
