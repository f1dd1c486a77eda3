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

A *closed* batch is different (`LLM.generate` once every request has a slot: none can arrive, none waits).
It lasts as long as its longest sequence, so a token accepted for any other saves nothing but that
sequence's own later row; there the plan is for the batch's end instead (`_plan_closed`).

The search is greedy: start from plain decode, add one depth at a time to the sequence whose next depth wins
the most tokens per node, and keep the best prefix of those moves. With every `beta` non-increasing in depth
this is the exact optimum for chains; for trees it uses the tree shape's node counts per depth.

Costs for batch sizes never measured are extrapolated optimistically (in proportion to the tokens below the
smallest measurement, flat above a single one), so the planner tries such a step once and learns what it
costs, rather than guessing from a model of the hardware. But a plan reaches at most one tree beyond the widest
step timed on the curve it uses (its price is learnt a tree at a time, as a closed batch's already was): at 64
requests at once, flat from its one measured width (64 rows, about 95 ms), the first plan verified 346 drafted
rows (a 380-420 ms step) for 61 accepted tokens (`bench/step_log.py`, run at the commit before this rule), and
`hybrid:suffix+recycle` ran at 0.92-0.94x of plain decode.
Measured prices follow the fastest recent steps (timing noise only ever adds), and after `EXPLORE_AFTER` steps
without speculation one sequence drafts its full tree once, so that a price measured during a stall is measured
again (then after twice as many, up to `EXPLORE_MAX`, while explorations change nothing); the other way round, a
plain step's price that speculation has left unmeasured for `REMEASURE_AFTER` steps is timed again by one plain step,
and so is a full tree's price that the plans have come to avoid, by one full tree (`_widen_if_stale`).

The estimates can still promise more than speculation delivers: the plan picks the sequences whose histories
look best (the winner's curse), and each estimate is optimistic on purpose. So the plan's promises are checked
against what happened: each speculative step's goodput gain (tokens accepted, for the rows verified and the
drafting done, priced on the step-cost curve) is averaged per batch size and number of drafted rows, and a plan
stays below the fewest rows where the evidence is firm that it is a loss, with a plan without that cap now and
then to measure again (`_row_cap`; node planning, which drafts before it plans, asks `should_draft` whether to
draft at all). At batch 8 on an AVX2 CPU a hybrid drafter bought rows at 0.42 accepted tokens each where 0.6
pays, and ran at 0.90-0.95x of plain decode. One sequence alone has no winner's curse and is not guarded.

Greedy outputs never depend on the plan: a shorter tree changes speed, never tokens. A *seeded* sampled request
is different: which random numbers it draws depends on its tree's shape, so to give the same output whatever
runs beside it, it always gets the full tree (it is pinned, and only priced in).
"""

from __future__ import annotations

import bisect
import heapq
import math
from typing import Callable

from specdec.drafters.calibration import AcceptanceCalibration
from specdec.engine.sequence import Sequence
from specdec.tree.spec import TreeSpec

PRIOR_WEIGHT = 4.0  # steps of evidence the drafter-wide estimate counts for in a sequence's own estimate
PRIOR_BETA = 0.5  # P(accept depth 1) before any evidence
# After this many steps in a row without speculation, one sequence gets the full tree once: a price that only
# speculation can measure is re-measured. Without it, one stalled step could switch speculation off for good
# (seen in the bench suite: a drafter at tau 1.00 beside the same drafter at 1.4 in the next run).
EXPLORE_AFTER = 16
# Each exploration that leaves the plan empty doubles the wait before the next, up to this many plans. Where rows
# are dear an exploration is too: on an AVX2 CPU one sequence's 8-node tree costs about 1.6 extra plain steps, so
# exploring every 16 plans cost suffix a tenth of its throughput at concurrency 4 (0.89x of plain decode, 1.01x
# with exploration off). A plan that chooses speculation on its own restores EXPLORE_AFTER.
EXPLORE_MAX = 16 * EXPLORE_AFTER
# A price goes stale where nothing measures it again: at 64 requests at once the first decode step after a burst of
# prefills (fresh KV pages to fault in) priced plain decode at 517 ms a step, every later plan speculated (so no
# step of that width was timed again) and a 95-token step (486 ms) looked cheaper than the 64-token one (340 ms
# in truth): `hybrid:suffix+recycle` verified 40 extra rows a step for 25 tokens and ran at 0.87x of plain decode.
# So when the measured width nearest the plan's plain step is older than this many observations, the plan is plain
# decode once, to time it again; each re-measurement that finds the price within REMEASURE_TOLERANCE doubles the
# wait (up to REMEASURE_MAX), one that finds it moved restores this. The tolerance is wider than most of a shared
# VM's step-to-step noise, so that at batch 1, where speculation runs every step, a held price soon stops costing
# plain steps, and far narrower than the error above (52%).
REMEASURE_AFTER = 16
REMEASURE_MAX = 16 * REMEASURE_AFTER
REMEASURE_TOLERANCE = 0.25
# The measured gain (node planning's drafting decision, the depth plan's gain guard) is a long-run average:
# retrieval drafters win in bursts (a copied span) between runs of steps with nothing to propose, and a short
# average dipped below the drafting cost after a few empty steps and skipped the next burst (suffix fell from
# 1.31x to 1.17x at batch 1 with a decay of 1/4).
GAIN_DECAY = 1 / 32
GAIN_EVIDENCE = 8  # drafted steps at a batch size before drafting there may be skipped
# Plans in a row without speculation after which the planner counts as idle, and the engine stops paying for
# what only speculation uses (`SpeculationPlanner.idle`). A few, so that one unlikely step at batch 1 changes
# nothing, while a server at saturation, where the plan is empty step after step, stops at once.
IDLE_AFTER = 4


def is_pinned(seq: Sequence) -> bool:
    """A seeded sampled request: its random draws depend on its tree's shape, so it always gets the drafter's
    full tree, as proposed, whatever runs beside it."""
    return not seq.params.greedy and seq.params.seed is not None


class StepCost:
    """Seconds per target forward as a function of batched tokens, from exponentially averaged buckets."""

    def __init__(self, decay: float = 0.25) -> None:
        self.decay = decay
        self._buckets: dict[int, list[float]] = {}  # bucket -> [mean tokens, mean seconds]
        self._points: list[tuple[float, float]] | None = None  # sorted view, rebuilt after an observation
        self._clock = 0  # observations so far
        self._seen: dict[int, int] = {}  # bucket -> the clock at its last observation

    @staticmethod
    def _bucket(n: int) -> int:
        return round(4 * math.log2(max(n, 1)))  # ~19% wide buckets

    def observe(self, tokens: int, seconds: float) -> None:
        """Fold one measured step into its bucket: down at once, up by `decay`.

        Timing noise is one-sided: a step is never faster than its work, but a stall (a page fault, a garbage
        collection, another process) makes it slower, by up to seconds on a shared machine. So a faster step
        is believed at once and a slower one only partly, and one stall cannot hold a bucket's price up for
        longer than the next measurement of it.

        A bucket spans widths (104 and 116 tokens share one), and a wider step is slower for its width, not
        for a stall: compared as they came, the narrower steps' times won and the bucket priced its mean width
        at the narrow end's time, so the slope to the next bucket, the price of extra rows, came out about half
        the truth at 64 requests at once. So times are compared in proportion to width: the observation and
        the bucket's price are both scaled to the bucket's new mean width first.
        """
        key = self._bucket(tokens)
        self._clock += 1
        self._seen[key] = self._clock
        entry = self._buckets.get(key)
        if entry is None:
            self._buckets[key] = [float(tokens), seconds]
        else:
            width = entry[0] + self.decay * (tokens - entry[0])
            price, seen = entry[1] * width / entry[0], seconds * width / max(tokens, 1)
            entry[0] = width
            entry[1] = seen if seen < price else price + self.decay * (seen - price)
        self._points = None

    @property
    def known(self) -> bool:
        return bool(self._buckets)

    def age(self, tokens: float) -> int:
        """Observations since the measured width nearest to `tokens` was last observed (0 if none is): how
        old the price is that `predict(tokens)` leans on most."""
        if not self._buckets:
            return 0
        key = min(self._buckets, key=lambda k: abs(self._buckets[k][0] - tokens))
        return self._clock - self._seen[key]

    def measured_up_to(self) -> float:
        """The most tokens of any measured step (0 if none): predictions above it are extrapolations."""
        return max((x for x, _ in self._buckets.values()), default=0.0)

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


class PrefillMargin:
    """The mixed-step curve seen from the decode side: seconds that `tokens` decode rows add to a step that
    also prefills `prefill` prompt tokens (never negative: the curve's buckets are noisy)."""

    def __init__(self, curve: StepCost, prefill: int) -> None:
        self.curve, self.prefill = curve, prefill
        self._base = curve.predict(prefill)

    def predict(self, tokens: float) -> float:
        return max(self.curve.predict(self.prefill + tokens) - self._base, 0.0)

    def measured_up_to(self) -> float:
        return max(self.curve.measured_up_to() - self.prefill, 0.0)


class SpeculationPlanner:
    def __init__(self) -> None:
        self.cost = StepCost()  # decode-only steps: what a decision changes
        self.mixed_cost = StepCost()  # steps that also prefill: a fallback until a decode-only step is seen
        self.draft_cost = StepCost()  # drafter seconds per tree depth, by the number of sequences drafting
        self._accepted: list[float] = []  # drafter-wide: steps that accepted >= d+1 drafted tokens
        self._proposed: list[float] = []  # drafter-wide: steps whose tree reached depth d+1
        self._idle_plans = 0  # plans in a row that chose no speculation at all
        # Node planning: P(accepted | parent accepted) by depth and score, optimistic while evidence is thin.
        self.calibration = AcceptanceCalibration(optimism=1.0)
        self._gain: dict[int, list[float]] = {}  # per batch-size bucket: speculative steps' goodput gain statistics
        self._gain_by_rows: dict[tuple[int, int], list[float]] = {}  # the same per (batch bucket, rows bucket)
        self._skipped = 0  # steps in a row that the gain guard kept from drafting (node planning)
        self._capped = 0  # depth plans the gain guard's row cap cut short since its last exploration
        self._cap_explore_every = EXPLORE_AFTER  # capped plans before one goes without the cap (doubles)
        self._explore_every = EXPLORE_AFTER  # idle plans before the next exploration (doubles, `EXPLORE_MAX`)
        self._draft_explore_every = EXPLORE_AFTER  # the same for steps the gain guard skipped
        self._guard_exploring = False  # the gain guard let this step draft only to measure again
        self._guard_seqs: frozenset[int] = frozenset()  # the sequences the gain guard last judged
        self._remeasure_every = REMEASURE_AFTER  # observations before a plain price is timed again (doubles)
        self._remeasuring: tuple[int, float] | None = None  # (tokens, predicted seconds) of a re-measurement
        self._widen_every = REMEASURE_AFTER  # observations before a full tree's avoided price is timed again
        self._widening: tuple[int, float] | None = None  # (tokens, predicted seconds) of such a step

    @property
    def idle(self) -> bool:
        """Has speculation been off for the last `IDLE_AFTER` plans (depth planning) or drafting skipped as
        long (node planning)? The engine then skips the drafter's reading of verified logits on steps that
        verified no drafted node: work for drafts nobody is making. Exploration steps (`EXPLORE_AFTER`) end
        the idle spell."""
        return self._idle_plans >= IDLE_AFTER or self._skipped >= IDLE_AFTER

    # ----------------------------------------------------------------------------------------- observations
    def observe_forward(self, tokens: int, seconds: float, prefill_tokens: int = 0) -> None:
        if not prefill_tokens:
            self._remeasure_every = self._next_wait(self._remeasuring, self._remeasure_every, tokens, seconds)
            self._widen_every = self._next_wait(self._widening, self._widen_every, tokens, seconds)
            self._remeasuring = self._widening = None
        (self.mixed_cost if prefill_tokens else self.cost).observe(tokens, seconds)

    @staticmethod
    def _next_wait(asked: tuple[int, float] | None, wait: int, tokens: int, seconds: float) -> int:
        """The wait before a price is timed again, after the step a plan asked for to time it (`asked`: its
        tokens and the price it had): doubled (up to REMEASURE_MAX) where the price held, back to
        REMEASURE_AFTER where it had moved; unchanged by any other step."""
        if asked is None or tokens != asked[0]:
            return wait
        moved = abs(seconds - asked[1]) > REMEASURE_TOLERANCE * asked[1]
        return REMEASURE_AFTER if moved else min(2 * wait, REMEASURE_MAX)

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
    def plan(self, seqs: list[Sequence], spec: TreeSpec, prefill_tokens: int = 0, closed: bool = False,
             waiting_left: int = 0) -> list[int]:
        """Tree depth per sequence (0 = no speculation) for the best expected goodput this step, or, when the
        batch is `closed` (no request can arrive or waits for a slot), for the fastest end of the batch;
        `waiting_left` is then the most tokens a sequence not yet running has to go."""
        if not seqs or spec.depth == 0:
            return [0] * len(seqs)
        if self._remeasure(seqs, prefill_tokens):
            return [spec.depth if is_pinned(seq) else 0 for seq in seqs]
        cost = self._decode_cost(prefill_tokens)
        if cost is None:  # nothing measured yet: speculate fully once and learn (in a closed batch, on one sequence)
            return [spec.depth if not closed or i == 0 or is_pinned(seq) else 0 for i, seq in enumerate(seqs)]
        prior = self._prior(spec.depth)
        betas = [self._blend(seq, prior) for seq in seqs]
        nodes = [spec.nodes_within(d) for d in range(spec.depth + 1)]
        base_tokens = len(seqs)
        widest = cost.measured_up_to() + nodes[spec.depth]  # one tree beyond the widest step timed
        draft = self.draft_cost

        def draft_seconds(drafting: int, deepest: int) -> float:
            return draft.predict(drafting) * deepest if drafting and draft.known else 0.0

        if closed and (len(seqs) > 1 or waiting_left > 0):  # one sequence alone: its goodput is the batch's end
            chosen = self._plan_closed(seqs, spec, betas, nodes, cost, base_tokens, draft_seconds, waiting_left,
                                       widest)
            return self._explore_if_idle(chosen, [b[0] for b in betas], [spec.depth] * len(seqs))
        pinned = [is_pinned(seq) for seq in seqs]
        depths = [spec.depth if pin else 0 for pin in pinned]
        cap = self._row_cap(seqs)  # the gain guard (module docstring): the most drafted rows that pay here
        gained = sum(sum(b) for b, pin in zip(betas, pinned) if pin)
        extra_nodes = nodes[spec.depth] * sum(pinned)
        deepest = spec.depth if any(pinned) else 0
        drafting = sum(pinned)
        heap = [(-betas[i][0] / max(nodes[1], 1), i) for i in range(len(seqs)) if nodes[1] > 0 and not pinned[i]]
        heapq.heapify(heap)
        seconds = cost.predict(base_tokens + extra_nodes) + draft_seconds(drafting, deepest)
        best_rate = free_rate = (len(seqs) + gained) / max(seconds, 1e-9)
        best_moves: list[int] = []
        moves: list[int] = []
        bound = False  # would the best plan without the cap verify more rows than it allows?
        while heap:
            _, i = heapq.heappop(heap)
            d = depths[i] + 1
            if base_tokens + extra_nodes + nodes[d] - nodes[d - 1] > widest:
                break
            depths[i] = d
            drafting += d == 1
            moves.append(i)
            gained += betas[i][d - 1]
            extra_nodes += nodes[d] - nodes[d - 1]
            deepest = max(deepest, d)
            seconds = cost.predict(base_tokens + extra_nodes) + draft_seconds(drafting, deepest)
            rate = (len(seqs) + gained) / max(seconds, 1e-9)
            if rate > free_rate:
                free_rate, bound = rate, extra_nodes > cap
            if rate > best_rate and extra_nodes <= cap:
                best_rate, best_moves = rate, list(moves)
            if d < spec.depth:
                step_nodes = max(nodes[d + 1] - nodes[d], 1)
                heapq.heappush(heap, (-betas[i][d] / step_nodes, i))
        chosen = [spec.depth if pin else 0 for pin in pinned]
        for i in best_moves:
            chosen[i] += 1
        if bound:
            self._capped += 1
        if not prefill_tokens:
            chosen = self._widen_if_stale(chosen, [b[0] for b in betas], nodes, base_tokens, cap)
        return self._explore_if_idle(chosen, [b[0] for b in betas], [spec.depth] * len(seqs), explore=not bound)

    @staticmethod
    def _plan_closed(seqs: list[Sequence], spec: TreeSpec, betas: list[list[float]], nodes: list[int],
                     cost: StepCost | PrefillMargin, base_tokens: int, draft_seconds: Callable[[int, int], float],
                     waiting_left: int = 0, widest: float = 0.0) -> list[int]:
        """Depths for a closed batch: one depth for the sequences that set its end, none for the others.

        With nobody waiting, a sequence that finishes early frees a slot nobody takes: the batch lasts as long
        as its longest sequence, and a token accepted anywhere else saves only that sequence's later row, which
        the rejected nodes beside it cost over again. (In a closed batch of 24 at 64 tokens, plain decode and
        `suffix` both took 65 forwards, and the goodput plan's extra rows made `suffix` 0.92-0.96x.) So the
        sequences with the most tokens left to go (within one tree's depth of the most) are critical, and
        speculation pays only if it moves all of them: the batch gains 1 + the least any of them is expected
        to accept a step, for the rows of all their trees. A sequence still waiting for its prefill, with as
        many tokens to go, ends after them whatever they accept: then nobody speculates. A step may be at most
        `widest` rows, one full tree wider than the widest decode step timed: the price of wider ones is an
        extrapolation, and a closed batch of 64 that believed the slope measured at batch 4 verified 47 trees
        at once (and seeded 2,244 prompt rows for them). Seeded sampled requests keep their full trees."""
        left = [seq.params.max_new_tokens - len(seq.output_ids) for seq in seqs]
        top = max(max(left), waiting_left)
        critical = [i for i, n in enumerate(left) if n >= top - spec.depth]
        stuck = 0 < waiting_left >= top - spec.depth  # the batch's end waits on a sequence not yet running
        pinned = [is_pinned(seq) for seq in seqs]
        movable = [i for i in critical if not pinned[i]]  # the critical sequences the plan decides for
        extra = nodes[spec.depth] * sum(pinned)

        def rate(d: int) -> float:
            moved = len(movable) if d else 0
            gained = min((sum(betas[i][:d]) for i in critical), default=0.0) if d and not stuck else 0.0
            drafting, deepest = moved + sum(pinned), spec.depth if any(pinned) else d
            rows = extra + nodes[d] * moved
            return (1.0 + gained) / max(cost.predict(base_tokens + rows) + draft_seconds(drafting, deepest), 1e-9)

        allowed = [d for d in range(spec.depth + 1)
                   if d == 0 or base_tokens + extra + nodes[d] * len(critical) <= widest]
        best = max(allowed, key=lambda d: (rate(d), -d))
        chosen = [spec.depth if pin else 0 for pin in pinned]
        for i in movable:
            chosen[i] = best
        return chosen

    def plan_nodes(self, seqs: list[Sequence], probs: list[list[float]], prefill_tokens: int = 0) -> list[int]:
        """How many nodes of each sequence's drafted tree to verify (0 = plain decode), from each node's
        estimated probability of being on the accepted path.

        For drafters cheap enough to run for every sequence before deciding (`Drafter.plans_by_node`):
        `probs[i]` lists sequence i's drafted nodes best first (a node never before its parent, so every prefix
        of the list is a tree). The search adds the next most probable node of any sequence while goodput,
        expected tokens per second of the target step, improves; the drafting is already paid for. A node
        the verifier would accept one time in ten is worth its row at batch 1 on this CPU, and at batch 16 only
        a near-certain one is: the per-node probabilities decide which rows pay, where the depth plan above
        can only say how deep a sequence's history says it should go."""
        if not seqs:
            return []
        if self._remeasure(seqs, prefill_tokens):
            return [len(p) if is_pinned(seq) else 0 for p, seq in zip(probs, seqs)]
        cost = self._decode_cost(prefill_tokens)
        if cost is None:
            return [len(p) for p in probs]  # nothing measured yet: verify every drafted node once and learn
        pinned = [is_pinned(seq) for seq in seqs]
        counts = [len(p) if pin else 0 for p, pin in zip(probs, pinned)]
        gained = sum(sum(p) for p, pin in zip(probs, pinned) if pin)
        tokens = len(seqs) + sum(counts)
        widest = cost.measured_up_to() + max(map(len, probs), default=0)  # one tree beyond the widest step timed
        best_rate = (len(seqs) + gained) / max(cost.predict(tokens), 1e-9)
        best = list(counts)
        heap = [(-p[0], i) for i, (p, pin) in enumerate(zip(probs, pinned)) if p and not pin]
        heapq.heapify(heap)
        while heap:
            neg, i = heapq.heappop(heap)
            if tokens + 1 > widest:
                break
            counts[i] += 1
            gained -= neg
            tokens += 1
            rate = (len(seqs) + gained) / max(cost.predict(tokens), 1e-9)
            if rate > best_rate:
                best_rate, best = rate, list(counts)
            if counts[i] < len(probs[i]):
                heapq.heappush(heap, (-probs[i][counts[i]], i))
        return self._explore_if_idle(best, [p[0] if p else 0.0 for p in probs], [len(p) for p in probs])

    def observe_gain(self, num_seqs: int, verified_nodes: int, accepted: int, draft_seconds: float = 0.0,
                     pinned: bool = False) -> None:
        """A speculative step verified `verified_nodes` drafted nodes over `num_seqs` sequences and accepted
        `accepted` of them: its goodput against plain decode's, both priced on the step-cost curve (the
        accepted count is what happened, not what the plan expected). `draft_seconds`, where given, is the
        step's measured drafting time, priced in (depth planning drafts only for the sequences it plans for;
        node planning drafts for all before deciding, and `should_draft` prices that separately).

        A step with a `pinned` sequence is not counted: its full tree was no plan's choice, and the gain
        guard judges the plans. Counted, a seeded warm-up of eight tokens (`bench/sampled_speed.py`: full
        4-deep chains from a Token Recycling matrix still empty) was firm evidence of a 26% loss, and the
        unseeded requests after it ran as plain decode."""
        if not self.cost.known or num_seqs <= 0 or pinned:
            return
        plain = max(self.cost.predict(num_seqs), 1e-9)
        rate = (num_seqs + accepted) / (max(self.cost.predict(num_seqs + verified_nodes), plain) + draft_seconds)
        plain_rate = num_seqs / plain
        gain = rate / plain_rate - 1.0
        batch = StepCost._bucket(num_seqs)
        _fold_gain(self._gain.setdefault(batch, [0.0, 0.0, 0.0]), gain)
        if verified_nodes:
            _fold_gain(self._gain_by_rows.setdefault((batch, verified_nodes.bit_length()), [0.0, 0.0, 0.0]), gain)

    def should_draft(self, seqs: list[Sequence], prefill_tokens: int = 0) -> bool:
        """Is drafting for these sequences worth it this step, on the evidence of what it gained here before?

        Node planning's gain guard (the depth plan's is `_row_cap`). A node-planned drafter's work happens
        before the plan, so the plan cannot price it; this does. It pays when the goodput gain of recent
        drafted steps at this batch size (`observe_gain`: the nodes they verified and accepted, against plain
        decode) exceeds the drafting time as a share of the step. At batch 1 a lookup drafter's 0.3 ms is 2% of a step
        and easily paid for; at batch 12 drafting every sequence costs about 5% of a step while near-certain
        nodes are all that pay for their rows. Skipped steps are counted, and after `EXPLORE_AFTER` of them one
        step drafts anyway, so the gain is measured again as the workload moves."""
        if any(is_pinned(seq) for seq in seqs):
            return True
        self._note_batch(seqs)
        cost = self._decode_cost(prefill_tokens)
        entry = self._gain.get(StepCost._bucket(len(seqs)))
        if cost is None or not self.draft_cost.known or not _firm(entry):
            self._skipped = 0
            return True
        if self._skipped >= self._draft_explore_every:  # drafted once to measure again; next time later
            self._skipped = 0
            self._draft_explore_every = min(2 * self._draft_explore_every, EXPLORE_MAX)
            self._guard_exploring = True  # and the plan must verify a tree, or nothing is measured
            return True
        plain = max(cost.predict(len(seqs)), 1e-9)
        if _optimistic_gain(entry) > self.draft_cost.predict(len(seqs)) / plain:
            self._skipped = 0
            self._draft_explore_every = EXPLORE_AFTER
            return True
        self._skipped += 1
        return False

    def _note_batch(self, seqs: list[Sequence]) -> None:
        """Half the batch or more new since the last judgement (a batch-1 user's next request): what drafting
        gains may have changed with them, so the wait before the gain guard's next exploration starts short
        again. Not for one new request among many: under load, where arrivals are steady, that reset drafted for
        a whole batch every EXPLORE_AFTER steps (the hybrid at 64 requests at once: 0.95x of plain decode)."""
        ids = frozenset(seq.seq_id for seq in seqs)
        if 2 * len(ids - self._guard_seqs) >= len(ids):
            self._draft_explore_every = self._cap_explore_every = EXPLORE_AFTER
        self._guard_seqs = ids

    def _row_cap(self, seqs: list[Sequence]) -> float:
        """The gain guard of the depth plan: the most drafted rows a plan for these sequences may verify, just
        below the fewest rows whose speculative steps at this batch size measured firmly as a loss (unbounded
        where none did, where a seeded sampled request takes its full tree anyway, and for one sequence alone).

        It judges plans by their size, not speculation as a whole: judged as a whole, the losses of the first
        plans (deep trees, chosen on estimates no evidence had yet humbled) or of price re-measurements (full
        trees) kept it shut while the plans it would then have made, a depth or two, gained. Every
        `_cap_explore_every` plans that the cap cut short (doubling, up to `EXPLORE_MAX`) one plan goes
        without it, so the sizes it forbids are measured again as the workload moves.

        It guards against the winner's curse, the plan picking the sequences whose histories look best, which
        one sequence alone cannot suffer: its plan rests on its own acceptance history, checked every step.
        Guarded, a lone request lost more than it was spared. At T 0.7 a request's first steps, a Token
        Recycling matrix and suffix tries still cold, lost 18% each; that was firm evidence, the plans went
        without speculation, and a plain step teaches a lookup drafter little, so the evidence never moved:
        `hybrid:suffix+recycle` ran every later request at tau 1.00-1.06 (`bench/sampled_speed.py --unseeded`:
        0.98x of plain decode, where its full trees give 1.15x), `recycle` at 1.01 (0.96x). What the guard did
        spare: drafters that lose at batch 1 whatever the plan (`draft`, `medusa`: 0.97x of plain decode in
        the greedy bench suite guarded, 0.93x without, twice; the hybrid 1.39x guarded, 1.38x and 1.41x without,
        `eagle` 1.08x, then 1.08x and 1.07x).
        Judged on its own steps only (evidence dropped when a new request comes) they gave 0.95x and 0.93x and
        the hybrid's tau fell from 1.94 to 1.84, so that is not the mend; their estimates' optimism is.
        """
        if len(seqs) < 2 or any(is_pinned(seq) for seq in seqs):
            return math.inf
        self._note_batch(seqs)
        batch = StepCost._bucket(len(seqs))
        losing = [rows for (b, rows), entry in self._gain_by_rows.items()
                  if b == batch and _firm(entry) and _optimistic_gain(entry) <= 0.0]
        if not losing:
            self._cap_explore_every = EXPLORE_AFTER
            return math.inf
        if self._capped >= self._cap_explore_every:  # one plan without the cap, to measure again; next time later
            self._capped = 0
            self._cap_explore_every = min(2 * self._cap_explore_every, EXPLORE_MAX)
            return math.inf  # (the plan it cut short before is what this one measures)
        return (1 << (min(losing) - 1)) - 1  # rows bucket k holds 2^(k-1) .. 2^k - 1 rows

    # ------------------------------------------------------------------------------------------- helpers
    def _decode_cost(self, prefill_tokens: int) -> StepCost | PrefillMargin | None:
        """The curve a decision is judged on: seconds as a function of the step's decode rows.

        Prefill work is the same whatever is decided, so the decision is judged on decode work alone: more
        tokens per second of it. Until a decode-only step has been timed, the mixed steps' curve stands in,
        priced at what decode rows add to this step's prefill (`PrefillMargin`). Judged on the whole mixed
        step instead, a row looked nearly free beside 1,900 prompt tokens: at 64 requests at once the first
        mixed steps verified 100-220 drafted rows each for 6-35 accepted tokens (0.75 ms a row on this CPU)."""
        if self.cost.known:
            return self.cost
        if self.mixed_cost.known:
            return PrefillMargin(self.mixed_cost, prefill_tokens) if prefill_tokens else self.mixed_cost
        return None

    def _remeasure(self, seqs: list[Sequence], prefill_tokens: int) -> bool:
        """Is this step's plain price stale (`REMEASURE_AFTER`)? Then the plan is plain decode, and the step
        times it again. Only decode-only steps re-measure (a prefill's step is priced on another curve)."""
        if prefill_tokens or not self.cost.known or self.cost.age(len(seqs)) <= self._remeasure_every:
            return False
        self._remeasuring = (len(seqs), self.cost.predict(len(seqs)))
        return True

    def _widen_if_stale(self, chosen: list[int], likelihood: list[float], nodes: list[int],
                        base_tokens: int, cap: float = math.inf) -> list[int]:
        """Where a plan speculates short of the full tree and the price of the full tree's width is stale
        (`REMEASURE_AFTER` observations, doubling while it holds), the likeliest such sequence gets its full
        tree once, so that the width is timed again.

        A price is believed down at once and up only partly (`StepCost.observe`), but only when the width is
        timed; one the plans have come to avoid is never timed again. At batch 1 on a Zen 4 EPYC the chain of
        3's 4-token step was priced at 18.1 ms against 10.9 for a plain one (a slow early step), where such a
        step costs 1.1-1.2x a plain one, so the hybrid drafted one token a step for the rest of the run (233
        of 243 plans of three requests; with this rule 162 of 189 took the full chain)."""
        full = len(nodes) - 1
        short = [i for i, d in enumerate(chosen) if 0 < d < full]
        if not short:
            return chosen
        i = max(short, key=lambda j: likelihood[j])
        tokens = base_tokens + sum(nodes[d] for d in chosen) - nodes[chosen[i]] + nodes[full]
        if self.cost.age(tokens) <= self._widen_every or tokens - base_tokens > cap:  # no plan may take it now
            return chosen
        chosen[i] = full
        self._widening = (tokens, self.cost.predict(tokens))
        return chosen

    def _explore_if_idle(self, chosen: list[int], likelihood: list[float], full: list[int],
                         explore: bool = True) -> list[int]:
        """After `EXPLORE_AFTER` plans in a row without speculation, the likeliest sequence gets its full tree
        (`full[i]`: a depth or a node count) once, so that a price measured during a stall is measured again.
        Each exploration doubles the wait before the next (up to `EXPLORE_MAX`), until a plan speculates again.

        So does a step the gain guard let node planning draft only to measure again (`should_draft`): planned on
        the same estimates that the guard's early losses had lowered, it chose no tree, measured nothing, and the
        guard waited twice as long each time. `suffix` on a first request whose opening steps matched nothing ran
        the whole bench suite at tau 1.00 (eight early steps at -3% were "firm" evidence)."""
        exploring, self._guard_exploring = self._guard_exploring, False
        if exploring and not any(chosen):
            candidates = [j for j in range(len(chosen)) if full[j] > 0]
            if candidates:
                i = max(candidates, key=lambda j: likelihood[j])
                chosen[i] = full[i]
                return chosen
        if any(chosen):
            self._idle_plans = 0
            self._explore_every = EXPLORE_AFTER
            return chosen
        self._idle_plans += 1
        if explore and self._idle_plans > self._explore_every:
            i = max(range(len(chosen)), key=lambda j: (full[j] > 0, likelihood[j]))
            if full[i]:
                self._idle_plans = 0
                self._explore_every = min(2 * self._explore_every, EXPLORE_MAX)
                chosen[i] = full[i]
        return chosen


def _fold_gain(entry: list[float], gain: float) -> None:
    """Fold one step's goodput gain into [mean, mean square, steps]: a plain mean at first, then a long moving
    average (`GAIN_DECAY`)."""
    entry[2] += 1
    weight = max(1.0 / entry[2], GAIN_DECAY)
    entry[0] += weight * (gain - entry[0])
    entry[1] += weight * (gain * gain - entry[1])


def _firm(entry: list[float] | None) -> bool:
    """Enough speculative steps (`GAIN_EVIDENCE`) behind a gain statistic to act on it."""
    return entry is not None and entry[2] >= GAIN_EVIDENCE


def _optimistic_gain(entry: list[float]) -> float:
    """The mean gain plus one standard error: optimistic, as the planner's acceptance estimates are. A bursty
    drafter's gain varies widely, so drafting is only given up where the evidence is firm that it costs more
    than it wins (at batch 12 the gain is steadily near nothing; at batch 1 it is not)."""
    mean, square, steps = entry
    return mean + math.sqrt(max(square - mean * mean, 0.0) / min(steps, 1.0 / GAIN_DECAY))
