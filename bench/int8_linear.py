"""Time int8 linear kernels against fp32 on SmolLM2-135M's linear shapes, on CPU.

The stack: 30 layers x [qkv 576->960, o 576->576, gate_up 576->3072, down 1536->576] with distinct random
weights (one call = all 120 linears, as one decode/verify step runs them); the LM head 576->49152 is timed
on its own. For each row count (1/4/8/16) every variant is timed once per repetition, in an order that
rotates from one repetition to the next, all in this one process; the table gives the median over the
repetitions after warmup, with the fastest repetition in parentheses.

Variants:
  fp32                 nn.Linear (MKL)
  int8 per-token (*)   specdec.models.quant.Int8DynamicLinear: fbgemm, rows scaled to max|x|=1, fixed 7-bit grid
  fbgemm per-tensor    quantized::linear_dynamic as is (one activation scale), 7-bit act (reduce_range)
  fbgemm per-tensor 8b same with 8-bit activations: exact only on AVX-512 VNNI CPUs
  onednn per-tensor    quantized::linear_dynamic on weights prepacked with the "onednn" engine
  _int_mm per-token    int8 rows (symmetric, 8-bit) by hand + torch._int_mm + scales
  weight-only int8     torch.ops.aten._weight_int8pack_mm, fp32 activations
  --slow adds:
  onednn qlinear       onednn::qlinear_pointwise (inductor's op), uint8 rows by hand
  torchao              Int8DynamicActivationInt8WeightConfig, when torchao is importable (not a dependency)

Also prints each variant's error against fp32 on one gate_up layer, 16 Gaussian rows, one of them 100x louder,
and whether a row computed alone gives the same bits as in that batch.

    python bench/int8_linear.py [--reps 25] [--warmup 3] [--rows 1,4,8,16] [--slow] [--only "fp32,int8 per-token (*)"]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import torch
from torch import nn

from specdec.models.quant import Int8DynamicLinear, quantize_weight_per_channel

HIDDEN, INTER, QKV, VOCAB, LAYERS = 576, 1536, 960, 49152, 30
LAYER_SHAPES = [(HIDDEN, QKV), (HIDDEN, HIDDEN), (HIDDEN, 2 * INTER), (INTER, HIDDEN)]

Fn = Callable[[torch.Tensor], torch.Tensor]


def _quiet():
    w = warnings.catch_warnings()
    w.__enter__()
    warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions.*deprecated")
    return w


def make_onednn_dynamic(lin: nn.Linear) -> Fn:
    q, s = quantize_weight_per_channel(lin.weight)
    w = _quiet()
    qw = torch._make_per_channel_quantized_tensor(q, s.double(), torch.zeros(len(s), dtype=torch.long), 0)
    old = torch.backends.quantized.engine
    torch.backends.quantized.engine = "onednn"
    packed = torch.ops.quantized.linear_prepack(qw, None)
    torch.backends.quantized.engine = old
    w.__exit__(None, None, None)
    op = torch.ops.quantized.linear_dynamic.default
    return lambda x: op(x, packed, False)


def _rows_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = torch.linalg.vector_norm(x, ord=float("inf"), dim=1, keepdim=True).clamp_min_(1e-30).div_(127)
    return torch.round(x / s).to(torch.int8), s


def make_int_mm(lin: nn.Linear) -> Fn:
    q, s = quantize_weight_per_channel(lin.weight)
    wt = q.T.contiguous()

    def f(x):
        xq, xs = _rows_int8(x)
        return torch._int_mm(xq, wt).float().mul_(xs).mul_(s)

    return f


def make_weight_only(lin: nn.Linear) -> Fn:
    q, s = quantize_weight_per_channel(lin.weight)
    return lambda x: torch.ops.aten._weight_int8pack_mm(x, q, s)


def make_onednn_qlinear(lin: nn.Linear) -> Fn:
    q, s = quantize_weight_per_channel(lin.weight)
    packed = torch.ops.onednn.qlinear_prepack(q, [16, q.shape[1]])
    zps = torch.zeros(len(s), dtype=torch.long)
    op = torch.ops.onednn.qlinear_pointwise.default

    def f(x):
        amax = torch.linalg.vector_norm(x, ord=float("inf"), dim=1, keepdim=True).clamp_min_(1e-30)
        xq = torch.round(x / amax * 127).add_(128).to(torch.uint8)
        y = op(xq, 1.0 / 127, 128, packed, s, zps, None, 1.0, 0, torch.float32, "none", [], "")
        return y.mul_(amax)

    return f


def make_torchao(lin: nn.Linear) -> Fn:
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    m = nn.Sequential(nn.Linear(lin.in_features, lin.out_features, bias=False))
    with torch.no_grad():
        m[0].weight.copy_(lin.weight)
    quantize_(m, Int8DynamicActivationInt8WeightConfig())
    return m


def variants(slow: bool) -> dict[str, Callable[[nn.Linear], Fn]]:
    v: dict[str, Callable[[nn.Linear], Fn]] = {
        "fp32": lambda lin: lin,
        "int8 per-token (*)": Int8DynamicLinear.from_linear,
        "fbgemm per-tensor": lambda lin: Int8DynamicLinear.from_linear(lin, per_token=False),
        "fbgemm per-tensor 8b": lambda lin: Int8DynamicLinear.from_linear(lin, per_token=False, reduce_range=False),
        "onednn per-tensor": make_onednn_dynamic,
        "_int_mm per-token": make_int_mm,
        "weight-only int8": make_weight_only,
    }
    if slow:
        v["onednn qlinear"] = make_onednn_qlinear
        try:
            import torchao  # noqa: F401

            v["torchao"] = make_torchao
        except Exception as exc:  # not installed, or it fails to import
            print(f"torchao skipped: {type(exc).__name__}: {exc}", file=sys.stderr)
    return v


def time_interleaved(fns: dict[str, Callable[[], object]], reps: int, warmup: int) -> dict[str, list[float]]:
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(warmup + reps):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for n in order:
            t0 = time.perf_counter()
            fns[n]()
            dt = time.perf_counter() - t0
            if rep >= warmup:
                times[n].append(dt)
    return times


def table(title: str, rows: list[int], res: dict[int, dict[str, list[float]]]) -> str:
    names = list(res[rows[0]])
    out = [f"{title}, ms per call: median (fastest)", "", "| rows | " + " | ".join(names) + " |",
           "|---" * (len(names) + 1) + "|"]
    for m in rows:
        cells = [f"{statistics.median(res[m][n]) * 1e3:.1f} ({min(res[m][n]) * 1e3:.1f})" for n in names]
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rows", default="1,4,8,16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slow", action="store_true", help="add onednn qlinear_pointwise and torchao (seconds per call)")
    ap.add_argument("--only", default="", help="comma-separated variant names to run (default: all)")
    args = ap.parse_args()
    if args.reps < 20:
        ap.error("--reps must be at least 20")
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    gen = torch.Generator().manual_seed(0)

    def linear(k: int, n: int) -> nn.Linear:
        lin = nn.Linear(k, n, bias=False)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(n, k, generator=gen) * 0.02)
        return lin

    stack_fp32 = [linear(k, n) for _ in range(LAYERS) for k, n in LAYER_SHAPES]
    head_fp32 = linear(HIDDEN, VOCAB)
    makers = variants(args.slow)
    if args.only:
        wanted = [n.strip() for n in args.only.split(",")]
        unknown = [n for n in wanted if n not in makers]
        if unknown:
            ap.error(f"unknown variants {unknown}; known: {list(makers)}")
        makers = {n: makers[n] for n in wanted}
    stacks = {name: [make(lin) for lin in stack_fp32] for name, make in makers.items()}
    heads = {name: make(head_fp32) for name, make in makers.items()}

    # Accuracy on one gate_up layer: 16 Gaussian rows, row 0 100x louder.
    probe = stack_fp32[2]
    x = torch.randn(16, HIDDEN, generator=gen)
    x[0] *= 100
    with torch.inference_mode():
        ref = probe(x)
        acc = {}
        for name in makers:
            y = stacks[name][2](x)
            alone = stacks[name][2](x[1:2].clone())
            acc[name] = (((y - ref)[1:].norm() / ref[1:].norm()).item(), ((y - ref)[:1].norm() / ref[:1].norm()).item(),
                         torch.equal(alone, y[1:2]))

    stack_res: dict[int, dict[str, list[float]]] = {}
    head_res: dict[int, dict[str, list[float]]] = {}
    with torch.inference_mode():
        for m in rows:
            xh = torch.randn(m, HIDDEN, generator=gen)
            xi = torch.randn(m, INTER, generator=gen)

            def run_stack(layers):
                for i, f in enumerate(layers):
                    f(xi if i % 4 == 3 else xh)

            stack_res[m] = time_interleaved({n: (lambda s=s: run_stack(s)) for n, s in stacks.items()}, args.reps, args.warmup)
            head_res[m] = time_interleaved({n: (lambda h=h: h(xh)) for n, h in heads.items()}, args.reps, args.warmup)
            print(f"rows {m} done", file=sys.stderr, flush=True)

    cmd = "python " + shlex.join(["bench/int8_linear.py", *sys.argv[1:]])
    print(f"`{cmd}` (torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}, {args.reps} reps)\n")
    print(table(f"All {LAYERS} layers' linears ({4 * LAYERS} calls)", rows, stack_res))
    print()
    print(table(f"LM head {HIDDEN}->{VOCAB}", rows, head_res))
    print()
    print("Relative error vs fp32, gate_up 576->3072, 16 Gaussian rows with row 0 x100:\n")
    print("| variant | 15 quiet rows | loud row | row alone == row in batch |\n|---|---|---|---|")
    for name, (quiet, loud, same) in acc.items():
        print(f"| {name} | {quiet:.2%} | {loud:.2%} | {'yes' if same else 'no'} |")


if __name__ == "__main__":
    main()
