"""Totals of interleaved `generate` calls per method, and the tok/s table the A/B benches print.

Shared by bench/sampled_speed.py and bench/hybrid_part_depth.py: each times every method on every prompt in turn
and reports tok/s over all prompts, the ratio to the first method and tau (tokens per target step).
"""

from __future__ import annotations

import time

from specdec import LLM, SamplingParams


class GenerateTotals:
    def __init__(self, methods: list[str]) -> None:
        self.methods = list(methods)
        self._sums = {m: [0, 0.0, 0] for m in self.methods}  # tokens, seconds, target steps

    def timed(self, method: str, llm: LLM, prompt: str, params: SamplingParams) -> None:
        """One request through `llm`, its tokens, wall time and target steps added to `method`'s totals."""
        start = time.perf_counter()
        out = llm.generate([prompt], params)[0]
        sums = self._sums[method]
        sums[1] += time.perf_counter() - start
        sums[0] += len(out.token_ids)
        sums[2] += out.metrics.target_steps

    def table(self) -> str:
        first_tokens, first_seconds, _ = self._sums[self.methods[0]]
        first = first_tokens / first_seconds
        lines = [f"| method | tok/s | over {self.methods[0]} | tau |", "|---|---|---|---|"]
        for m, (tokens, seconds, steps) in self._sums.items():
            lines.append(f"| {m} | {tokens / seconds:.1f} | {tokens / seconds / first:.2f}x | "
                         f"{tokens / max(steps, 1):.2f} |")
        return "\n".join(lines)
