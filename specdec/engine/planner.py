"""Adaptive speculation: how deep each sequence's draft tree may be this step (0 = plain decode).

Speculation pays only when the tokens it wins are worth the extra work: drafting, and target rows for the tree
nodes. On a GPU at batch 1 extra rows are nearly free; on a CPU, or at large batch on any device, the target
is compute-bound and every row costs. vLLM users' top complaint is speculation running *slower* than plain
decode under load. So each step the planner maximises goodput,

    expected tokens emitted / expected step time
    = sum_i (1 + sum_{d <= k_i} beta_{i,d})  /  (T(prefill + sum_i (1 + nodes(k_i))) + draft(max_i k_i))

over the per-sequence depths k_i, from three things it measures as the engine runs:

* `beta_{i,d}`: the probability that sequence i accepts at least d drafted tokens (its own history at depth d,
  blended with the drafter's across all sequences, so a young sequence starts from a sensible prior), plus one
  standard error: an optimistic estimate, so that a drafter unlucky in its first steps is tried again until
  the evidence is firm, instead of being switched off for good by a bad start;
* `T(n)`: seconds of one target forward over n batched tokens (`StepCost`, piecewise linear in n);
* the drafter's seconds per drafted depth, as a function of how many sequences draft (a batched draft
  forward grows with its batch, so drafting for 64 sequences is priced as such).

The search is greedy: start from plain decode, add one depth at a time to the sequence whose next depth wins
the most tokens per node, and keep the best prefix of those moves. With every `beta` non-increasing in depth
this is the exact optimum for chains; for trees it uses the tree shape's node counts per depth.

Costs for batch sizes never measured are extrapolated optimistically (in proportion to the tokens below the
smallest measurement, flat above a single one), so the planner tries such a step once and learns what it
costs, rather than guessing from a model of the hardware. Measured prices follow the fastest recent steps
(timing noise only ever adds), and after `EXPLORE_AFTER` steps without speculation one sequence drafts its full
tree once, so that a price measured during a stall is measured again. Greedy outputs never depend on the plan:
a shorter tree changes speed, never tokens. A *seeded*
sampled request is different: which random numbers it draws depends on its tree's shape, so to give the same
output whatever runs beside it, it always gets the full tree (it is pinned, and only priced in).
"""

from __future__ import annotations

import bisect
import heapq
import math

from specdec.engine.sequence import Sequence
from specdec.tree.spec import TreeSpec

PRIOR_WEIGHT = 4.0  # steps of evidence the drafter-wide estimate counts for in a sequence's own estimate
PRIOR_BETA = 0.5  # P(accept depth 1) before any evidence
# After this many steps in a row without speculation, one sequence gets the full tree once: a price that only
# speculation can measure is re-measured. Without it, one stalled step could switch speculation off for good
# (seen in the bench suite: a drafter at tau 1.00 beside the same drafter at 1.4 in the next run).
EXPLORE_AFTER = 16


class StepCost:
    """Seconds per target forward as a function of batched tokens, from exponentially averaged buckets."""

    def __init__(self, decay: float = 0.25) -> None:
        self.decay = decay
        self._buckets: dict[int, list[float]] = {}  # bucket -> [mean tokens, mean seconds]
        self._points: list[tuple[float, float]] | None = None  # sorted view, rebuilt after an observation

    @staticmethod
    def _bucket(n: int) -> int:
        return round(4 * math.log2(max(n, 1)))  # ~19% wide buckets

    def observe(self, tokens: int, seconds: float) -> None:
        """Fold one measured step into its bucket: down at once, up by `decay`.

        Timing noise is one-sided: a step is never faster than its work, but a stall (a page fault, a garbage
        collection, another process) makes it slower, by up to seconds on a shared machine. So a faster step
        is believed at once and a slower one only partly, and one stall cannot hold a bucket's price up for
        longer than the next measurement of it.
        """
        key = self._bucket(tokens)
        entry = self._buckets.get(key)
        if entry is None:
            self._buckets[key] = [float(tokens), seconds]
        else:
            entry[0] += self.decay * (tokens - entry[0])
            entry[1] = seconds if seconds < entry[1] else entry[1] + self.decay * (seconds - entry[1])
        self._points = None

    @property
    def known(self) -> bool:
        return bool(self._buckets)

    def predict(self, tokens: float) -> float:
        if self._points is None:
            self._points = sorted((x, y) for x, y in self._buckets.values())
        points = self._points
        if not points:
            return 0.0
        i = bisect.bisect_left(points, (tokens, -math.inf))
        if i == 0:  # smaller than anything measured: optimistic (proportional), so it gets tried and measured
            return points[0][1] * min(tokens / points[0][0], 1.0)
        if i == len(points):
            if len(points) == 1:
                return points[0][1]  # optimistic: try bigger steps once, then we know
            (x0, y0), (x1, y1) = points[-2], points[-1]
            slope = max((y1 - y0) / (x1 - x0), 0.0) if x1 > x0 else 0.0
            return y1 + slope * (tokens - x1)
        (x0, y0), (x1, y1) = points[i - 1], points[i]
        return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0) if x1 > x0 else y1


class SpeculationPlanner:
    def __init__(self) -> None:
        self.cost = StepCost()  # decode-only steps: what a decision changes
        self.mixed_cost = StepCost()  # steps that also prefill: a fallback until a decode-only step is seen
        self.draft_cost = StepCost()  # drafter seconds per tree depth, by the number of sequences drafting
        self._accepted: list[float] = []  # drafter-wide: steps that accepted >= d+1 drafted tokens
        self._proposed: list[float] = []  # drafter-wide: steps whose tree reached depth d+1
        self._idle_plans = 0  # plans in a row that chose no speculation at all

    # ----------------------------------------------------------------------------------------- observations
    def observe_forward(self, tokens: int, seconds: float, prefill_tokens: int = 0) -> None:
        (self.mixed_cost if prefill_tokens else self.cost).observe(tokens, seconds)

    def observe_draft(self, depth: int, seconds: float, num_seqs: int = 1) -> None:
        if depth > 0 and num_seqs > 0:
            self.draft_cost.observe(num_seqs, seconds / depth)

    def observe_step(self, tree_depth: int, accepted: int) -> None:
        while len(self._proposed) < tree_depth:
            self._proposed.append(0.0)
            self._accepted.append(0.0)
        for d in range(tree_depth):
            self._proposed[d] += 1
            self._accepted[d] += accepted > d

    # ------------------------------------------------------------------------------------------- estimates
    def _prior(self, depth: int) -> list[float]:
        """Drafter-wide P(accept >= d) for d = 1..depth, non-increasing; unseen depths continue the decay."""
        betas: list[float] = []
        for d in range(depth):
            if d < len(self._proposed) and self._proposed[d] > 0:
                seen = self._proposed[d] + 1
                beta = (self._accepted[d] + PRIOR_BETA ** (d + 1)) / seen
                beta = min(beta + math.sqrt(beta * (1 - beta) / seen), 1.0)  # optimism: keep exploring while unsure
            elif d >= 2 and betas[-2] > 0:
                beta = betas[-1] * betas[-1] / betas[-2]
            else:
                beta = (betas[-1] if betas else 1.0) * PRIOR_BETA
            betas.append(min(beta, betas[-1]) if betas else beta)
        return betas

    @staticmethod
    def _blend(seq: Sequence, prior: list[float]) -> list[float]:
        m = seq.metrics
        betas: list[float] = []
        for d, p in enumerate(prior):
            seen = m.proposed_by_depth[d] if d < len(m.proposed_by_depth) else 0
            hits = m.accepted_by_depth[d] if d < len(m.accepted_by_depth) else 0
            beta = (hits + PRIOR_WEIGHT * p) / (seen + PRIOR_WEIGHT)
            beta = min(beta + math.sqrt(beta * (1 - beta) / (seen + PRIOR_WEIGHT)), 1.0)
            betas.append(min(beta, betas[-1]) if betas else beta)
        return betas

    # ------------------------------------------------------------------------------------------------ plan
    def plan(self, seqs: list[Sequence], spec: TreeSpec, prefill_tokens: int = 0) -> list[int]:
        """Tree depth per sequence (0 = no speculation) for the best expected goodput this step."""
        if not seqs or spec.depth == 0:
            return [0] * len(seqs)
        # Prefill work is the same whatever is decided, so the decision is judged on decode steps alone: more
        # tokens per second of decode work. Until a decode-only step has been timed, mixed steps stand in.
        cost = self.cost
        if cost.known:
            prefill_tokens = 0
        elif self.mixed_cost.known:
            cost = self.mixed_cost
        else:
            return [spec.depth] * len(seqs)  # nothing measured yet: speculate fully once and learn
        prior = self._prior(spec.depth)
        betas = [self._blend(seq, prior) for seq in seqs]
        nodes = [spec.nodes_within(d) for d in range(spec.depth + 1)]
        base_tokens = prefill_tokens + len(seqs)
        draft = self.draft_cost

        def draft_seconds(drafting: int, deepest: int) -> float:
            return draft.predict(drafting) * deepest if drafting and draft.known else 0.0

        pinned = [not seq.params.greedy and seq.params.seed is not None for seq in seqs]
        depths = [spec.depth if pin else 0 for pin in pinned]
        gained = sum(sum(b) for b, pin in zip(betas, pinned) if pin)
        extra_nodes = nodes[spec.depth] * sum(pinned)
        deepest = spec.depth if any(pinned) else 0
        drafting = sum(pinned)
        heap = [(-betas[i][0] / max(nodes[1], 1), i) for i in range(len(seqs)) if nodes[1] > 0 and not pinned[i]]
        heapq.heapify(heap)
        seconds = cost.predict(base_tokens + extra_nodes) + draft_seconds(drafting, deepest)
        best_rate = (len(seqs) + gained) / max(seconds, 1e-9)
        best_moves: list[int] = []
        moves: list[int] = []
        while heap:
            _, i = heapq.heappop(heap)
            d = depths[i] + 1
            depths[i] = d
            drafting += d == 1
            moves.append(i)
            gained += betas[i][d - 1]
            extra_nodes += nodes[d] - nodes[d - 1]
            deepest = max(deepest, d)
            seconds = cost.predict(base_tokens + extra_nodes) + draft_seconds(drafting, deepest)
            rate = (len(seqs) + gained) / max(seconds, 1e-9)
            if rate > best_rate:
                best_rate, best_moves = rate, list(moves)
            if d < spec.depth:
                step_nodes = max(nodes[d + 1] - nodes[d], 1)
                heapq.heappush(heap, (-betas[i][d] / step_nodes, i))
        chosen = [spec.depth if pin else 0 for pin in pinned]
        for i in best_moves:
            chosen[i] += 1
        if any(chosen):
            self._idle_plans = 0
        else:
            self._idle_plans += 1
            if self._idle_plans > EXPLORE_AFTER:  # re-measure: the likeliest sequence drafts its full tree once
                self._idle_plans = 0
                chosen[max(range(len(seqs)), key=lambda i: betas[i][0])] = spec.depth
        return chosen
