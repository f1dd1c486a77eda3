"""Does torch.compile beat the compiled kernels on the CPU decode path? The MLP sublayer of the default model
(residual + RMSNorm + gate_up + SiLU * up + down), float32, three ways, interleaved in one process:

  eager      the plain forward's torch ops (specdec/models/llama.py)
  compiled   the same function through torch.compile (inductor, C++ codegen; dynamic=False, one graph per T)
  kernels    the fast path's calls: specdec.kernels.cpu rms_norm (with the residual) and silu_mul around the linears

    python bench/compile_probe.py [--rows 1,8] [--reps 200] [--threads 1]

Prints microseconds per call (median over repetitions) and the compile time. The attention sublayer is left
out: paged attention is data-dependent (block tables, tree masks), which dynamo cannot trace without graph breaks.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from specdec.kernels import cpu as cpu_kernels


def mlp_eager(x, y, norm_w, eps, gate_up_w, down_w):
    x = x + y
    x32 = x.float()
    h = norm_w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))
    gate, up = F.linear(h, gate_up_w).chunk(2, dim=-1)
    return x, F.linear(F.silu(gate) * up, down_w)


def glue_eager(x, y, norm_w, eps, gate_up):
    """The elementwise work only (no matmuls): residual, RMSNorm, SiLU * up."""
    x = x + y
    x32 = x.float()
    h = norm_w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))
    gate, up = gate_up.chunk(2, dim=-1)
    return h, F.silu(gate) * up


def glue_kernels(x, y, norm_w, eps, gate_up):
    (h,) = cpu_kernels.rms_norm(x, norm_w, eps, 0, y, None)
    return h, cpu_kernels.silu_mul(gate_up, None, 0)[0]


def mlp_kernels(x, y, norm_w, eps, gate_up_w, down_w):
    (h,) = cpu_kernels.rms_norm(x, norm_w, eps, 0, y, None)  # x += y in place
    (act,) = cpu_kernels.silu_mul(F.linear(h, gate_up_w), None, 0)
    return x, F.linear(act, down_w)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not cpu_kernels.available():
        raise SystemExit("the compiled CPU kernels are unavailable")
    hidden, inter, eps = 576, 1536, 1e-5
    gen = torch.Generator().manual_seed(0)
    norm_w = torch.rand(hidden, generator=gen) + 0.5
    gate_up_w = torch.randn(2 * inter, hidden, generator=gen) * 0.05
    down_w = torch.randn(hidden, inter, generator=gen) * 0.05
    for what, eager, kernels in (("sublayer", mlp_eager, mlp_kernels), ("glue only", glue_eager, glue_kernels)):
        compiled = torch.compile(eager, dynamic=False)
        for rows in (int(r) for r in args.rows.split(",")):
            x, y = torch.randn(rows, hidden, generator=gen), torch.randn(rows, hidden, generator=gen)
            extra = (gate_up_w, down_w) if what == "sublayer" else (torch.randn(rows, 2 * inter, generator=gen),)
            start = time.perf_counter()
            with torch.inference_mode():
                compiled(x.clone(), y, norm_w, eps, *extra)
            compile_s = time.perf_counter() - start
            fns = {"eager": eager, "compiled": compiled, "kernels": kernels}
            times: dict[str, list[float]] = {name: [] for name in fns}
            with torch.inference_mode():
                want = eager(x.clone(), y, norm_w, eps, *extra)[1]
                for fn in fns.values():
                    torch.testing.assert_close(fn(x.clone(), y, norm_w, eps, *extra)[1], want, atol=1e-4, rtol=1e-4)
                for _ in range(args.reps):
                    for name, fn in fns.items():
                        xc = x.clone()
                        t = time.perf_counter()
                        fn(xc, y, norm_w, eps, *extra)
                        times[name].append(time.perf_counter() - t)
            line = "  ".join(f"{name} {1e6 * statistics.median(ts):7.1f} us" for name, ts in times.items())
            print(f"{what}, rows {rows}: {line}   (first compiled call {compile_s:.1f} s)")


if __name__ == "__main__":
    main()
