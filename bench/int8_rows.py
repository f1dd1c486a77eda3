"""What do extra verify rows cost in the int8 linears? Every linear of a model's shape at R rows, by instruction set.

    OMP_NUM_THREADS=1 python bench/int8_rows.py                              # SmolLM2-135M, AVX-512 and AVX2
    OMP_NUM_THREADS=1 python bench/int8_rows.py --model qwen2.5-coder-1.5b --rows 1,2,3,5,9
    OMP_NUM_THREADS=1 python bench/int8_rows.py --isa avx2 --bits 8,7             # int8 against int7 weights
    OMP_NUM_THREADS=1 python bench/int8_rows.py --isa avx512 --layouts tiles,blocks  # VNNI: the two weight layouts

Random int8 weights of the model's shapes (per layer fused q/k/v, o, fused gate/up and down; then the LM head),
through our CPU kernel (`QLinear.forward_q8`), one thread. Each row count is timed over the whole stack, best
of `--rounds`; row counts and instruction sets run interleaved round by round, so drift on a shared machine
hits them alike. If each tile of weights is read once for all rows, R rows cost far less than R times one row;
how much less depends on how fast the kernel's arithmetic is once the weights are in cache (AVX-512 VNNI:
64 products an instruction; AVX2: 32 in four instructions, or in three with 7-bit weights, `--bits 7`).
`--layouts` times the int8 weights as 4-channel tiles (`pack_q8`, every level's fallback) and as blocks of 16
channels (`pack_q8_blocks`, which QLinear packs at the avx512 and amx levels), interleaved like the rest.
"""

from __future__ import annotations

import argparse
import time

import torch

from specdec.kernels import cpu
from specdec.models import qlinear
from specdec.models.qlinear import QLinear

MODELS = {  # layers, hidden, q + 2 kv width, intermediate, vocabulary
    "smollm2-135m": (30, 576, 960, 1536, 49152),
    "qwen2.5-coder-1.5b": (28, 1536, 2048, 8960, 151936),
    "qwen2.5-coder-0.5b": (24, 896, 1152, 4864, 151936),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", choices=sorted(MODELS))
    parser.add_argument("--rows", default="1,2,4,8,12,16")
    parser.add_argument("--isa", default="amx,avx512,avx2", help="comma list of amx, avx512, avx2 (kernels.cpu.isa)")
    parser.add_argument("--bits", default="8", help="comma list of weight bits: 8 (int8), 7 (int7), 4 (int4, groups of 32)")
    parser.add_argument("--layouts", default="blocks", help="comma list of tiles, blocks (int8 and int7 weights)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not cpu.available():
        raise SystemExit("the compiled CPU kernels are not available here")
    layers_n, hidden, qkv, inter, vocab = MODELS[args.model]
    shapes = [(hidden, qkv), (hidden, hidden), (hidden, 2 * inter), (inter, hidden)] * layers_n + [(hidden, vocab)]
    rows = [int(r) for r in args.rows.split(",")]
    isas = [i for i in args.isa.split(",") if cpu.isa(i) == i]  # a CPU measures the levels it has
    cpu.isa("amx")  # the best level while the layers are built: where it is AMX, they carry its weight copy
    kernels = qlinear.kernels
    linears = [torch.nn.Linear(k, n, bias=False) for k, n in shapes]
    bits = [int(b) for b in args.bits.split(",")]
    layers = {b: [QLinear.from_linear(linear, b) for linear in linears] for b in bits}
    macs = sum(k * n for k, n in shapes)
    acts = {r: {k: kernels.quantize(torch.randn(r, k), kernels.Q8) for k in (hidden, inter)} for r in rows}
    layouts = args.layouts.split(",")
    if not set(layouts) <= {"tiles", "blocks"}:
        raise SystemExit("--layouts takes tiles and blocks")
    runs = [(isa, b, lay) for isa in isas for b in bits for lay in (layouts if b != 4 else ["tiles"])]
    best = {(run, r): float("inf") for run in runs for r in rows}
    for _ in range(args.rounds):
        for r in rows:
            for isa, b, lay in runs:
                cpu.isa(isa)
                start = time.perf_counter()
                for (k, _), layer in zip(shapes, layers[b]):
                    if lay == "blocks" or b == 4:
                        layer.forward_q8(acts[r][k])
                    else:  # the same layer without its blocked copy: the 4-channel tiles
                        q, s, _ = acts[r][k]
                        kernels.linear_q8(q, s, layer.weight, layer.weight_scale, None, b, None)
                best[(isa, b, lay), r] = min(best[(isa, b, lay), r], time.perf_counter() - start)
    cpu.isa("amx")
    print(f"{args.model}: int8 weights {macs / 1e6:.0f} MB, one thread, best of {args.rounds} rounds")
    for run in runs:
        isa, b, lay = run
        for r in rows:
            t = best[run, r]
            name = f"int{b} {lay}" if b != 4 else "int4"
            print(f"{isa:>6} {name:<11} {r:3d} rows: {t * 1e3:7.2f} ms  {t / best[run, rows[0]]:.2f}x of "
                  f"{rows[0]} row(s)  {r * macs / t / 1e9:6.1f} GMAC/s")


if __name__ == "__main__":
    main()
