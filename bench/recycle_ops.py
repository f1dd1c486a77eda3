"""What does Token Recycling's bookkeeping cost a step? Its three operations, compiled against the numpy reference.

    OMP_NUM_THREADS=1 python bench/recycle_ops.py [--rows 3] [--rounds 5] [--out FILE.json]

On a matrix shaped like the default target's (49,152 tokens, k = 8, 2^16 pair rows), warmed with random rows,
one thread, timed with timeit, best of `--rounds`, the variants interleaved round by round:
* `top`: `AdjacencyMatrix.top` of `--rows` rows of logits (the compiled `top_k_probs`; torch's topk plus a
  logsumexp beside it, what the reference path would take);
* `write`: `write_rows` of those rows (a verified step's writes), compiled and numpy;
* `expand`: `expand_many` of one root along a `--rows - 1` chain (a draft), compiled and numpy.
"""

from __future__ import annotations

import argparse
import json
import timeit
from pathlib import Path

import torch

from specdec.drafters.recycle_matrix import AdjacencyMatrix, template_layout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3, help="verified rows a step (a chain of rows - 1 drafts)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--number", type=int, default=500, help="calls per timing")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    vocab, k = 49152, 8
    gen = torch.Generator().manual_seed(0)
    matrices = {name: AdjacencyMatrix(vocab, k, pair_bits=16) for name in ("compiled", "numpy")}
    matrices["compiled"].compiled, matrices["numpy"].compiled = True, False
    for _ in range(64):  # the same warm rows in both
        tokens, prev = torch.randint(0, 2000, (8,), generator=gen), torch.randint(-1, 2000, (8,), generator=gen)
        logits = torch.randn(8, vocab, generator=gen)
        for matrix in matrices.values():
            matrix.update(tokens, logits, prev)
    logits = torch.randn(args.rows, vocab, generator=gen) * 3
    probs, ids = matrices["compiled"].top(logits)
    tokens = torch.randint(0, 2000, (args.rows,), generator=gen).tolist()
    prevs = torch.randint(-1, 2000, (args.rows,), generator=gen).tolist()
    layout = template_layout(tuple((0,) * d for d in range(1, args.rows)))
    cases = {"top (compiled top_k_probs)": lambda: matrices["compiled"].top(logits),
             "top (torch topk + logsumexp)": lambda: (logits.topk(k), logits.logsumexp(-1))}
    for name, matrix in matrices.items():
        cases[f"write ({name})"] = lambda m=matrix: m.write_rows(tokens, prevs, list(range(args.rows)), ids, probs)
        cases[f"expand ({name})"] = lambda m=matrix: m.expand_many([tokens[0]], [prevs[0]], layout)
    best = {name: float("inf") for name in cases}
    for _ in range(args.rounds):
        for name, call in cases.items():
            best[name] = min(best[name], timeit.timeit(call, number=args.number) / args.number * 1e6)
    print(f"us per call, best of {args.rounds} rounds, {args.rows} rows, one thread")
    for name, us in best.items():
        print(f"| {name} | {us:.1f} |")
    if args.out:
        args.out.write_text(json.dumps({"rows": args.rows, "us_per_call": best}, indent=1) + "\n")


if __name__ == "__main__":
    main()
