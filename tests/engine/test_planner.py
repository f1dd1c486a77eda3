"""The speculation planner: deterministic decisions from injected measurements (no timing in tests)."""

from __future__ import annotations

import time

import pytest
import torch

from specdec.engine.planner import SpeculationPlanner, StepCost
from specdec.config import SamplingParams
from specdec.engine.sequence import Sequence
from specdec.tree.spec import chain, parse_tree_spec


def seq(i: int, accepted_by_depth: list[int] = (), proposed_by_depth: list[int] = (), **params) -> Sequence:
    s = Sequence(i, [1, 2, 3], SamplingParams(**params), torch.Generator())
    s.metrics.accepted_by_depth = list(accepted_by_depth)
    s.metrics.proposed_by_depth = list(proposed_by_depth)
    return s


def planner(cost_per_token: float, fixed: float = 0.02, draft_per_depth: float = 0.0) -> SpeculationPlanner:
    p = SpeculationPlanner()
    for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512):
        p.observe_forward(n, fixed + cost_per_token * n)
    if draft_per_depth:
        p.observe_draft(1, draft_per_depth, num_seqs=1)
    return p


def test_step_cost_interpolates_and_extrapolates():
    cost = StepCost()
    assert not cost.known
    cost.observe(10, 1.0)
    assert cost.predict(20) == 1.0  # one point: flat above (optimistic) ...
    assert cost.predict(5) == pytest.approx(0.5)  # ... proportional below
    cost.observe(30, 3.0)
    assert cost.predict(20) == pytest.approx(2.0)
    assert cost.predict(40) == pytest.approx(4.0)


def test_cheap_rows_and_good_acceptance_speculate_fully():
    p = planner(cost_per_token=0.0001)
    seqs = [seq(i, [9, 8, 7, 6, 5], [10] * 5) for i in range(4)]
    assert p.plan(seqs, chain(5)) == [5, 5, 5, 5]


def test_compute_bound_steps_switch_speculation_off():
    p = planner(cost_per_token=0.01, fixed=0.005)  # every row costs about as much as the fixed part
    seqs = [seq(i, [5, 2, 1], [10] * 3) for i in range(64)]
    assert p.plan(seqs, chain(3)) == [0] * 64


def test_the_better_accepting_sequence_gets_the_deeper_tree():
    p = planner(cost_per_token=0.003, fixed=0.02)
    good, bad = seq(0, [95, 90, 85, 80], [100] * 4), seq(1, [10, 1, 0, 0], [100] * 4)
    depths = p.plan([good, bad], chain(4))
    assert depths[0] > depths[1]
    assert depths[1] == 0


def test_expensive_drafting_is_priced_in():
    seqs = [seq(0, [60, 36, 20], [100] * 3)]
    assert planner(0.0001).plan(seqs, chain(3)) == [3]
    assert planner(0.0001, draft_per_depth=0.05).plan(seqs, chain(3)) == [0]


def test_seeded_sampled_requests_always_get_the_full_tree():
    p = planner(cost_per_token=0.01, fixed=0.005)
    pinned = seq(0, [0, 0], [10, 10], temperature=0.8, seed=3)
    free = seq(1, [0, 0], [10, 10], temperature=0.8)
    assert p.plan([pinned, free], chain(2)) == [2, 0]


def test_nothing_measured_means_full_trees_once():
    assert SpeculationPlanner().plan([seq(0), seq(1)], chain(4)) == [4, 4]


def test_tree_specs_count_nodes_per_depth():
    spec = parse_tree_spec("static:tree-8")
    assert [spec.nodes_within(d) for d in range(5)] == [0, 2, 5, 7, 8]
    assert spec.limited(2).budget == 5 and spec.limited(2).depth == 2
    dynamic = parse_tree_spec("dynamic:depth=4,topk=3,budget=10")
    assert [dynamic.nodes_within(d) for d in range(5)] == [0, 3, 10, 10, 10]


def test_draft_cost_grows_with_the_number_of_sequences_drafting():
    """Cheap to draft for one sequence, dear for sixty-four: the planner drafts for the best few only."""
    p = planner(cost_per_token=0.0001, fixed=0.2)
    p.observe_draft(1, 0.001, num_seqs=1)
    p.observe_draft(1, 0.064, num_seqs=64)
    good = [seq(i, [90, 80], [100, 100]) for i in range(4)]
    poor = [seq(4 + i, [10, 1], [100, 100]) for i in range(60)]
    depths = p.plan(good + poor, chain(2))
    assert all(d > 0 for d in depths[:4])
    assert sum(d > 0 for d in depths) < 64


def test_a_stalled_step_raises_a_price_only_until_the_next_measurement():
    cost = StepCost()
    cost.observe(2, 0.020)
    cost.observe(2, 0.300)  # a stall: believed only in part
    assert 0.020 < cost.predict(2) < 0.1
    cost.observe(2, 0.021)  # the next ordinary step
    assert cost.predict(2) == pytest.approx(0.021)
    cost.observe(2, 0.025)  # real growth (a longer context) is still followed, gradually
    assert 0.021 < cost.predict(2) < 0.025


def test_speculation_switched_off_is_tried_again_less_and_less_often():
    from specdec.engine.planner import EXPLORE_AFTER, EXPLORE_MAX

    p = planner(cost_per_token=0.01, fixed=0.005)  # extra rows cost as much as the step: never worth it
    seqs = [seq(i, [3 + i, 1, 0], [10] * 3) for i in range(4)]
    plans = [p.plan(seqs, chain(3)) for _ in range(1000)]
    explored = [i for i, depths in enumerate(plans) if any(depths)]
    waits = [b - a - 1 for a, b in zip([-1] + explored, explored)]
    # each exploration that changes nothing doubles the wait before the next, up to EXPLORE_MAX plans
    assert waits == [EXPLORE_AFTER * 2**k for k in range(5)] + [EXPLORE_MAX] * (len(waits) - 5)
    assert plans[EXPLORE_AFTER] == [0, 0, 0, 3]  # one sequence, the likeliest to accept, with the full tree


def test_a_plan_that_speculates_again_restores_the_short_exploration_wait():
    from specdec.engine.planner import EXPLORE_AFTER

    p = planner(cost_per_token=0.01, fixed=0.005)
    seqs = [seq(i, [3 + i, 1, 0], [10] * 3) for i in range(4)]
    for _ in range(3 * EXPLORE_AFTER + 2):  # two explorations: the wait is now 4 * EXPLORE_AFTER
        p.plan(seqs, chain(3))
    assert p._explore_every == 4 * EXPLORE_AFTER
    p.cost = planner(cost_per_token=0.0001).cost  # rows became cheap: speculation pays again
    assert any(p.plan(seqs, chain(3)))
    assert p._explore_every == EXPLORE_AFTER


# ------------------------------------------------------------------------------------------ node planning
def test_cheap_rows_verify_every_likely_node():
    p = planner(cost_per_token=0.0001)
    assert p.plan_nodes([seq(0), seq(1)], [[0.9, 0.8, 0.7], [0.6, 0.3]]) == [3, 2]


def test_compute_bound_steps_verify_only_near_certain_nodes():
    """Rows cost as much as a tenth of the step each: a node pays only if it is nearly sure to be accepted."""
    p = planner(cost_per_token=0.002, fixed=0.01)
    seqs = [seq(i) for i in range(8)]
    probs = [[0.99, 0.97], [0.5, 0.2]] + [[0.3]] * 6
    counts = p.plan_nodes(seqs, probs)
    assert counts[0] >= 1 and counts[1:] == [0] * 7


def test_node_plans_take_the_most_probable_nodes_across_sequences():
    # fixed 20 ms, 4 ms a row: with ~2 tokens per step a row pays when p > ~0.4
    p = planner(cost_per_token=0.004, fixed=0.02)
    counts = p.plan_nodes([seq(0), seq(1)], [[0.95, 0.9, 0.2], [0.8, 0.05]])
    assert counts == [2, 1]


def test_plans_reach_at_most_one_tree_beyond_the_widest_step_timed():
    """One width timed (64 rows): flat above it, 346 drafted rows looked free. Each plan may go one tree
    further, so the price of wider steps is learnt a tree at a time."""
    p = SpeculationPlanner()
    p.observe_forward(64, 0.094)
    seqs = [seq(i, [90, 80, 70], [100] * 3) for i in range(64)]
    depths = p.plan(seqs, chain(3))
    assert 0 < sum(depths) <= 3  # one chain of 3 at most (before: 64 chains, 192 rows)
    counts = p.plan_nodes(seqs, [[0.9, 0.8, 0.7, 0.6, 0.5, 0.4]] * 64)
    assert 0 < sum(counts) <= 6
    p.observe_forward(512, 0.094)  # timed that wide, and as cheap: now every node pays
    assert p.plan_nodes(seqs, [[0.9, 0.8, 0.7, 0.6, 0.5, 0.4]] * 64) == [6] * 64


def test_a_mixed_step_prices_decode_rows_at_what_they_add_to_its_prefill():
    """Only steps that also prefill have been timed (one of 2,048 tokens). Beside 1,929 prompt tokens a
    drafted row adds 0.73 ms, as a decode row does: with rows priced in proportion to their work a node pays
    only if it is sure, whereas judged on the whole mixed step 17 decode tokens made each row look nearly free
    (the first steps of 64 requests at once verified 100-220 rows each for 6-35 tokens)."""
    p = SpeculationPlanner()
    p.observe_forward(2048, 1.5, prefill_tokens=2031)
    seqs = [seq(i, [90, 80, 70], [100] * 3) for i in range(17)]
    assert p.plan_nodes(seqs, [[0.5, 0.4, 0.3]] * 17, prefill_tokens=1929) == [0] * 17
    assert p.plan(seqs, chain(3), prefill_tokens=1929) == [0] * 17
    # where the mixed curve says rows beside a prefill are nearly free (a GPU), they are verified
    q = SpeculationPlanner()
    q.observe_forward(1024, 1.0, prefill_tokens=1000)
    q.observe_forward(2048, 1.01, prefill_tokens=2000)
    assert q.plan_nodes(seqs, [[0.5, 0.4, 0.3]] * 17, prefill_tokens=1000) == [3] * 17


def test_node_plans_give_seeded_sampled_requests_every_node():
    p = planner(cost_per_token=0.01, fixed=0.005)
    pinned = seq(0, temperature=0.8, seed=3)
    free = seq(1, temperature=0.8)
    assert p.plan_nodes([pinned, free], [[0.1, 0.1], [0.1, 0.1]]) == [2, 0]
    assert SpeculationPlanner().plan_nodes([seq(0), seq(1)], [[0.2, 0.1], [0.3]]) == [2, 1]  # nothing measured


def test_drafting_is_skipped_while_it_costs_more_than_it_gains_and_retried():
    from specdec.engine.planner import EXPLORE_AFTER, GAIN_EVIDENCE

    seqs = [seq(i) for i in range(8)]
    cheap = planner(cost_per_token=0.002, fixed=0.01)
    cheap.observe_draft(1, 0.0001, num_seqs=8)
    dear = planner(cost_per_token=0.002, fixed=0.01)
    dear.observe_draft(1, 0.005, num_seqs=8)  # a fifth of the 26 ms step
    for p in (cheap, dear):
        for _ in range(GAIN_EVIDENCE):
            assert p.should_draft(seqs)  # never skipped before the gain at this batch size is known
            p.observe_gain(8, verified_nodes=2, accepted=2)  # two tokens for two rows: +8% goodput
    assert cheap.should_draft(seqs)
    decisions = [dear.should_draft(seqs) for _ in range(EXPLORE_AFTER + 1)]
    assert decisions == [False] * EXPLORE_AFTER + [True]  # skipped, then drafted once to measure again
    later = [dear.should_draft(seqs) for _ in range(2 * EXPLORE_AFTER + 1)]
    assert later == [False] * (2 * EXPLORE_AFTER) + [True]  # that draft won nothing: twice as long a wait
    pinned = seq(9, temperature=0.8, seed=1)
    assert dear.should_draft(seqs + [pinned])  # a seeded sampled request always gets its drafter's tree


def test_an_idle_plan_explores_with_a_tree_and_a_new_request_shortens_the_drafting_guards_wait():
    """An exploration must measure something: planned on estimates that early losses lowered, a step chose no
    tree, and the wait doubled each time, for good (`suffix` on the bench suite: tau 1.00 on every prompt after
    eight unlucky opening steps). A new request may gain otherwise: the wait before the drafting guard's next
    exploration (node planning's `should_draft`) starts short again."""
    from specdec.engine.planner import EXPLORE_AFTER, GAIN_EVIDENCE

    p = planner(cost_per_token=0.005, fixed=0.01)  # a drafted row costs a third of a plain step
    seqs = [seq(0, [0, 0, 0], [10, 10, 10])]  # nothing accepted so far: on its estimates no depth pays
    for _ in range(GAIN_EVIDENCE):
        p.observe_gain(1, verified_nodes=3, accepted=0, draft_seconds=0.001)  # the same loss each time: firm
    plans = [p.plan(seqs, chain(3)) for _ in range(EXPLORE_AFTER + 1)]
    assert plans == [[0]] * EXPLORE_AFTER + [[3]]  # skipped, then the full tree once: a measured step
    newcomer = [seq(1, [0, 0, 0], [10, 10, 10])]  # the next request, at the same batch size
    p.observe_draft(1, 1e-6)  # node planning prices its drafting: here next to nothing
    waits = [p.should_draft(newcomer) for _ in range(EXPLORE_AFTER + 1)]
    assert waits == [False] * EXPLORE_AFTER + [True]  # not 2 * EXPLORE_AFTER: the batch has a new request


def draft_cost_after_a_request(drafter) -> StepCost:
    """The depth plan's drafting price after one 12-token request on the tiny model with a 3-chain."""
    from tests.helpers import run_all, tiny_engine, tiny_model

    engine = tiny_engine(tiny_model(seed=3), drafter, chain(3), adaptive_speculation=True)
    engine.add_request([1, 2, 3, 1, 2, 3, 1, 2], SamplingParams(max_new_tokens=12, ignore_eos=True))
    run_all(engine)
    return engine.planner.draft_cost


def test_a_sequences_first_draft_is_not_priced_as_a_drafting_step():
    """A drafter's first proposal for a sequence also takes in its whole prompt (a draft model prefills it): a
    once-per-request cost. Priced per depth it would switch speculation off for EXPLORE_AFTER steps; here the
    request is shorter than that, so a price taken from the slow first call would still stand at the end."""
    from specdec.drafters.ngram import NgramDrafter

    class SlowFirstProposal(NgramDrafter):
        def __init__(self) -> None:
            super().__init__()
            self.seen: set[int] = set()

        def propose(self, seqs, spec):
            if any(s.seq_id not in self.seen for s in seqs):
                self.seen.update(s.seq_id for s in seqs)
                time.sleep(0.5)
            return super().propose(seqs, spec)

    cost = draft_cost_after_a_request(SlowFirstProposal())
    assert cost.known and cost.predict(1) < 0.1, cost.predict(1)


def test_the_depth_plans_drafting_price_includes_the_drafters_reading_of_the_verified_step():
    """Token Recycling reads every verified row's top-k after the step, about as dear as its proposing: the
    depth plan must price that reading as drafting, or it buys trees whose bookkeeping it never pays for."""
    from specdec.drafters.ngram import NgramDrafter

    class SlowReading(NgramDrafter):
        def commit(self, seqs, results):
            time.sleep(0.06)
            return super().commit(seqs, results)

    cost = draft_cost_after_a_request(SlowReading())
    assert cost.known and cost.predict(1) >= 0.06 / 3, cost.predict(1)  # at least the reading, per depth


def test_the_planner_is_idle_only_after_a_run_of_plans_without_speculation():
    from specdec.engine.planner import EXPLORE_AFTER, IDLE_AFTER

    p = planner(cost_per_token=0.01, fixed=0.005)  # extra rows never worth it
    seqs = [seq(i, [3 + i, 1, 0], [10] * 3) for i in range(4)]
    idle = []
    for _ in range(EXPLORE_AFTER + 2):
        p.plan(seqs, chain(3))
        idle.append(p.idle)
    # idle from the IDLE_AFTER-th empty plan on; the exploring plan (index EXPLORE_AFTER) ends the spell
    assert idle == [False] * (IDLE_AFTER - 1) + [True] * (EXPLORE_AFTER - IDLE_AFTER + 1) + [False, False]
    cheap = planner(cost_per_token=0.0001)
    for _ in range(2 * IDLE_AFTER):
        cheap.plan(seqs, chain(3))
    assert not cheap.idle


# ------------------------------------------------------------------------------------------ closed batches


def left(s: Sequence, max_new_tokens: int, generated: int) -> Sequence:
    s.params = SamplingParams(max_new_tokens=max_new_tokens)
    s.output_ids = [7] * generated
    return s


def test_a_closed_batch_speculates_only_if_every_sequence_that_sets_its_end_gains():
    p = planner(cost_per_token=0.001, fixed=0.02)  # rows cheap: the goodput plan speculates for good acceptors
    good = [left(seq(i, [90, 80, 70], [100] * 3), 64, 0) for i in range(7)]
    poor = left(seq(7, [0, 0, 0], [100] * 3), 64, 0)  # accepts nothing: the batch ends with it either way
    assert any(p.plan(good + [poor], chain(3)))
    assert p.plan(good + [poor], chain(3), closed=True) == [0] * 8
    depths = p.plan(good, chain(3), closed=True)
    assert depths[0] > 0 and depths == [depths[0]] * 7  # all of them gain, by one depth: the batch ends sooner


def test_a_closed_batch_speculates_for_its_longest_sequence_alone():
    p = planner(cost_per_token=0.001, fixed=0.02)
    short = [left(seq(i, [90, 80, 70], [100] * 3), 64, 40) for i in range(3)]  # 24 tokens to go
    long = left(seq(3, [90, 80, 70], [100] * 3), 64, 0)  # 64 to go: the batch lasts as long as this one
    assert p.plan(short + [long], chain(3), closed=True) == [0, 0, 0, 3]
    # ... unless a sequence still waiting for its prefill has as far to go: it ends last whatever runs now
    assert p.plan(short + [long], chain(3), closed=True, waiting_left=64) == [0] * 4


def test_a_closed_batch_plans_no_step_much_wider_than_any_it_has_measured():
    p = SpeculationPlanner()
    for n in (1, 2, 4, 8, 12):  # a warm-up at batch 4 or so: rows look nearly free up to here
        p.observe_forward(n, 0.02 + 0.0005 * n)
    seqs = [left(seq(i, [90, 80, 70], [100] * 3), 64, 0) for i in range(64)]
    assert p.plan(seqs, chain(3), closed=True) == [0] * 64  # 64 trees' price would be a guess
    p.observe_forward(64, 0.02 + 0.0005 * 64)
    p.observe_forward(256, 0.02 + 0.0005 * 256)
    assert p.plan(seqs, chain(3), closed=True) == [2] * 64  # measured that wide, and cheap: worth it


def test_generate_plans_its_batch_as_closed_and_the_server_engine_never_does():
    """`LLM.generate` adds every request before it steps, so its batch is closed once none waits for a slot; the
    flag is down again afterwards, for the engine a server drives (requests arrive at any time)."""
    from tests.server.harness import tiny_llm

    llm = tiny_llm("ngram", "chain:k=3", max_num_seqs=2)
    planner, plan = llm.engine.planner, llm.engine.planner.plan
    closed: list[bool] = []

    def recording(*args, **kwargs):
        closed.append(kwargs["closed"])
        return plan(*args, **kwargs)

    planner.plan = recording
    outs = llm.generate(["a b c a b c a b", "c b a c b a", "a a b b a a"], SamplingParams(max_new_tokens=6))
    assert len(outs) == 3 and not llm.engine.arrivals_closed
    # two slots, three requests: open while the third waits for a slot, closed once it has one
    assert closed[0] is False and closed[-1] is True


def test_a_closed_batch_of_one_speculates_to_its_last_token():
    """Near its end a lone sequence still sets the batch's end: nothing waiting must not read as a waiting
    sequence with nothing to go."""
    p = planner(cost_per_token=0.0001)
    last = left(seq(0, [9, 8, 7, 6, 5], [10] * 5), 64, 62)  # two tokens to go
    assert p.plan([last], chain(5), closed=True)[0] > 0


def test_a_closed_batch_learns_its_price_on_one_sequence_and_keeps_seeded_trees_full():
    """Nothing measured yet: a closed batch explores on one sequence, not all; a seeded sampled request still
    gets its full tree, so its random draws do not depend on the batch it runs in."""
    p = SpeculationPlanner()
    seqs = [seq(0), seq(1), seq(2, temperature=0.8, seed=1)]
    assert p.plan(seqs, chain(3), closed=True) == [3, 0, 3]
    assert p.plan(seqs, chain(3)) == [3, 3, 3]


def test_step_cost_age_counts_observations_since_the_nearest_width_was_timed():
    cost = StepCost()
    assert cost.age(64) == 0  # nothing measured: nothing stale
    cost.observe(64, 0.5)
    for _ in range(5):
        cost.observe(96, 0.48)
    assert cost.age(64) == 5 and cost.age(62) == 5  # 62 leans on the 64-token price
    assert cost.age(95) == 0
    cost.observe(64, 0.34)
    assert cost.age(64) == 0 and cost.age(96) == 1


def stale_plain_price(p: SpeculationPlanner, spec_steps: int) -> None:
    """The c64 failure: the first 64-token decode step timed during a stall (0.52 s; 0.34 s in truth), then only
    speculating steps of 80-128 tokens, each timed at its true 5 ms a token."""
    p.observe_forward(64, 0.52)
    for i in range(spec_steps):
        tokens = 80 + (i * 12) % 48
        p.observe_forward(tokens, 0.005 * tokens)


def test_a_stale_plain_price_is_timed_again_and_then_speculation_stops_where_rows_do_not_pay():
    from specdec.engine.planner import REMEASURE_AFTER

    p = SpeculationPlanner()
    stale_plain_price(p, REMEASURE_AFTER)
    seqs = [seq(i, [6, 5, 5], [10] * 3) for i in range(64)]  # about 0.6 accepted a row: a row costs 1.0
    assert any(p.plan(seqs, chain(3)))  # the stale price makes 40 extra rows look cheaper than none
    p.observe_forward(100, 0.5)
    plan = p.plan(seqs, chain(3))
    assert plan == [0] * 64  # older than REMEASURE_AFTER: plain decode once, to time it
    p.observe_forward(64, 0.005 * 64)
    assert p.plan(seqs, chain(3)) == [0] * 64  # the true price: rows at 0.6 tokens each do not pay
    assert p.cost.predict(64) == pytest.approx(0.32)


def test_re_measuring_waits_longer_while_prices_hold_and_not_at_all_for_prefill_steps():
    from specdec.engine.planner import REMEASURE_AFTER, REMEASURE_MAX

    p = planner(cost_per_token=0.0001)  # cheap rows: every plan speculates, nothing is stale yet
    seqs = [seq(i, [9, 8, 7], [10] * 3) for i in range(4)]
    waits = []
    for _ in range(3):
        steps = 0
        while any(p.plan(seqs, chain(3))):
            p.observe_forward(4 + 12, 0.02 + 0.0001 * 16)  # each speculating step times a 16-token width
            steps += 1
        waits.append(steps)
        p.observe_forward(4, 0.02 + 0.0001 * 4)  # the re-measurement finds the price it had
    # the first wait counts from the helper's own measurements; then each held price doubles it
    assert waits[0] <= REMEASURE_AFTER + 1
    assert waits[1] == 2 * REMEASURE_AFTER + 1 and waits[2] == 4 * REMEASURE_AFTER + 1
    for _ in range(REMEASURE_MAX + 1):  # the wait is 8x the first by now; never past REMEASURE_MAX
        p.observe_forward(16, 0.02 + 0.0001 * 16)
    assert any(p.plan(seqs, chain(3), prefill_tokens=30))  # a step that prefills does not re-measure
    assert p.plan(seqs, chain(3)) == [0] * 4
    p.observe_forward(4, 0.05)  # the price had moved: the next re-measurement comes after the short wait again
    assert p._remeasure_every == REMEASURE_AFTER


def test_a_full_tree_whose_price_the_plans_avoid_is_timed_again_and_then_chosen():
    """The Zen 4 batch-1 failure: a chain of 3's first 4-token step timed slow (18 ms against 11 for a plain
    step; 12.5 in truth), after which every plan drafted one token (2-token steps, timed true), so the 4-token
    price was never timed again. After REMEASURE_AFTER observations the plan takes the full tree once; timed
    true, the full tree is then what the plan chooses, and the wait before the next check doubles."""
    from specdec.engine.planner import REMEASURE_AFTER

    p = SpeculationPlanner()
    p.observe_forward(1, 0.011)
    p.observe_forward(4, 0.018)
    p.observe_forward(2, 0.0115)
    one = seq(0, [60, 35, 20], [100] * 3)  # P(accept >= d) 0.6, 0.35, 0.2
    assert p.plan([one], chain(3)) == [1]  # 0.35 + 0.2 more tokens do not pay 6.5 ms of stale price
    asked = []
    for _ in range(2 * REMEASURE_AFTER):  # each plan's step timed true (a plain one now and then, re-measured)
        depth = p.plan([one], chain(3))[0]
        asked.append(depth)
        if depth == 3:
            break
        p.observe_forward(1 + depth, 0.011 if depth == 0 else 0.0115)
    assert asked[-1] == 3 and set(asked[:-1]) <= {0, 1}  # stale: the full tree once, to time it
    assert len(asked) >= REMEASURE_AFTER
    p.observe_forward(4, 0.0125)
    assert p.plan([one], chain(3)) == [3]  # the true price: the full tree pays
    assert p._widen_every == REMEASURE_AFTER  # the price had moved: the short wait again


def test_a_stale_full_tree_price_is_not_re_timed_by_a_plan_that_already_takes_it_or_takes_none():
    from specdec.engine.planner import REMEASURE_AFTER

    p = planner(cost_per_token=0.0001)  # cheap rows: full trees
    p.observe_forward(4, 0.02)
    for _ in range(REMEASURE_AFTER + 1):  # the 8-token width (two full chains) grows stale; taken anyway
        p.observe_forward(2, 0.02)
    seqs = [seq(i, [9, 8, 7], [10] * 3) for i in range(2)]
    assert p.plan(seqs, chain(3)) == [3, 3]
    assert p._widening is None
    q = planner(cost_per_token=0.01, fixed=0.005)  # every row costs: plain decode, nothing widened
    bad = [seq(i, [1, 0, 0], [10] * 3) for i in range(2)]
    assert q.plan(bad, chain(3)) == [0, 0] and q._widening is None


def test_seeded_sampled_requests_keep_their_trees_while_a_price_is_re_measured():
    from specdec.engine.planner import REMEASURE_AFTER

    p = SpeculationPlanner()
    stale_plain_price(p, REMEASURE_AFTER + 1)
    seqs = [seq(0, [6, 5, 5], [10] * 3, temperature=0.8, seed=1), seq(1, [6, 5, 5], [10] * 3)]
    assert p.plan(seqs, chain(3)) == [3, 0]


def test_a_depth_plan_stays_below_the_rows_whose_speculative_steps_lost_goodput_at_that_batch_size():
    """The depth plan trusts its acceptance estimates; where what its speculative steps really gained (tokens
    accepted for the rows verified and the drafting done, priced on the step-cost curve) falls short of plain
    decode at this batch size and that many rows, its plans stay below that many rows there, with a plan
    without the cap now and then to measure again; where every size lost, it plans plain decode. Other batch
    sizes keep their own evidence. (A hybrid drafter at batch 8 on AVX2 bought rows at 0.42 accepted tokens
    each where 0.6 pays: 0.90x of plain decode.)"""
    from specdec.engine.planner import EXPLORE_AFTER, GAIN_EVIDENCE

    p = planner(cost_per_token=0.002, fixed=0.01)  # a row costs a fifth of a plain batch-1 step
    hopeful = [seq(i, [9, 8], [10, 10]) for i in range(8)]  # histories that promise a lot
    assert sum(p.plan(hopeful, chain(2))) == 16
    for _ in range(GAIN_EVIDENCE):
        p.observe_gain(8, verified_nodes=16, accepted=3, draft_seconds=0.001)  # 3 tokens for 16 rows
    plans = [p.plan(hopeful, chain(2)) for _ in range(EXPLORE_AFTER + 1)]
    assert [sum(plan) for plan in plans] == [15] * EXPLORE_AFTER + [16]  # below 16 rows, then 16 to measure again
    for rows in (1, 2, 4, 8):  # every smaller size loses too
        for _ in range(GAIN_EVIDENCE):
            p.observe_gain(8, verified_nodes=rows, accepted=0, draft_seconds=0.001)
    plans, idle = [], []
    for _ in range(2 * EXPLORE_AFTER + 1):
        plans.append(p.plan(hopeful, chain(2)))
        idle.append(p.idle)
    assert plans[:-1] == [[0] * 8] * (2 * EXPLORE_AFTER) and any(plans[-1])  # off, then a step to measure again
    assert idle[-2] and not idle[-1]  # the engine stops paying for what only speculation uses, until then
    alone = [seq(0, [9, 8], [10, 10])]
    assert any(p.plan(alone, chain(2)))  # batch 1 has no such evidence
    paying = planner(cost_per_token=0.002, fixed=0.01)
    for _ in range(GAIN_EVIDENCE):
        paying.observe_gain(8, verified_nodes=16, accepted=14, draft_seconds=0.001)
    assert all(sum(paying.plan(hopeful, chain(2))) == 16 for _ in range(EXPLORE_AFTER + 1))
    pinned = seq(9, temperature=0.8, seed=1)
    assert p.plan(hopeful[:7] + [pinned], chain(2))[-1] == 2  # a seeded sampled request keeps its full tree


def test_deep_plans_that_lost_do_not_stop_shallow_ones_that_pay_and_one_sequence_alone_is_not_guarded():
    """The gain guard judges plans by their size: the first plans, made on estimates no evidence had yet
    humbled, went deep and lost; smaller plans are still made, until they lose too. One sequence alone is not
    guarded at all (no winner's curse: its plan rests on its own history): at T 0.7 a cold drafter's first
    steps locked `hybrid:suffix+recycle` out for every later request (`bench/sampled_speed.py --unseeded`: tau
    1.00-1.06). Losses of a seeded request's full trees are not the plan's and are not counted."""
    from specdec.engine.planner import GAIN_EVIDENCE

    p = planner(cost_per_token=0.0015, fixed=0.01)  # a row costs 15% of a plain batch-1 step
    pair = [seq(i, [6, 5, 4, 4], [10, 10, 10, 10]) for i in range(2)]  # histories that promise a lot
    assert p.plan(pair, chain(4)) == [4, 4]
    for _ in range(GAIN_EVIDENCE):
        p.observe_gain(2, verified_nodes=8, accepted=0, draft_seconds=0.0001, pinned=True)
    assert p._gain_by_rows == {} and p._gain == {}
    for _ in range(GAIN_EVIDENCE):
        p.observe_gain(2, verified_nodes=8, accepted=0, draft_seconds=0.0001)  # four deep each, nothing accepted
    assert sum(p.plan(pair, chain(4))) == 7
    for rows in (2, 4, 7):
        for _ in range(GAIN_EVIDENCE):
            p.observe_gain(2, verified_nodes=rows, accepted=0, draft_seconds=0.0001)  # smaller plans lose too
    assert p.plan(pair, chain(4)) in ([1, 0], [0, 1])
    for _ in range(GAIN_EVIDENCE):
        p.observe_gain(2, verified_nodes=1, accepted=0, draft_seconds=0.0001)  # and one depth
    assert p.plan(pair, chain(4)) == [0, 0]
    alone = planner(cost_per_token=0.0015, fixed=0.01)
    for rows in (1, 2, 4):
        for _ in range(GAIN_EVIDENCE):
            alone.observe_gain(1, verified_nodes=rows, accepted=0, draft_seconds=0.0001)
    assert alone.plan(pair[:1], chain(4)) == [4]


def test_the_engine_reports_what_each_speculative_step_of_the_depth_plan_gained(monkeypatch):
    """The gain guard above needs the engine's figures: a drafter that is always wrong records a loss (rows
    bought for nothing), one that is always right a gain."""
    from tests.helpers import ScriptedDrafter, StepClock, run_all, tiny_engine, tiny_model

    model = tiny_model(seed=5, vocab=16, sharpness=3.0)
    prompts, params = [[1, 2, 3], [4, 5, 6, 7], [8, 9]], SamplingParams(max_new_tokens=24, ignore_eos=True)

    def run(drafter):
        engine = tiny_engine(model, drafter, chain(3), kv_cache_tokens=1024, block_size=4, adaptive_speculation=True)
        StepClock().install(engine, monkeypatch)
        seqs = [engine.add_request(p, params) for p in prompts]
        run_all(engine)
        return engine.planner, [s.output_ids for s in seqs]

    from specdec.drafters.none import NoDrafter

    _, plain = run(NoDrafter())
    continuation = dict(enumerate(plain))
    gains = {}
    for name, offset in (("right", 0), ("liar", 1)):
        p, outputs = run(ScriptedDrafter(name, continuation, offset=offset, score=0.5, vocab=16))
        assert outputs == plain
        steps = sum(entry[2] for entry in p._gain.values())
        assert steps > 0
        gains[name] = sum(entry[0] * entry[2] for entry in p._gain.values()) / steps
    assert gains["liar"] < 0 < gains["right"]
