"""The engine step: schedule, propose, forward, verify, commit, finish.

    waiting ─► Scheduler ─► prefill chunks + decoding sequences
    Planner + Drafter.propose ─► one TokenTree per decoding sequence
    ONE target forward over every chunk and every tree node (tree-masked attention over the paged cache)
    verify (greedy, batched; or rejection sampling per sequence) ─► accepted path + bonus token per sequence
    KV commit (compact accepted path, truncate the rest) ─► Drafter.commit ─► stop checks ─► outputs

Plain decode is the same step with the `none` drafter, whose trees are just the root. The engine knows no
tokenizer internals (stopping.py decodes) and no cache internals (the scheduler and runner own them).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from torch import Tensor

from specdec.config import EngineConfig, SamplingParams
from specdec.drafters.base import Drafter
from specdec.engine.health import check_finite_logits
from specdec.engine.node_planning import NodePlannedDrafting
from specdec.engine.planner import SpeculationPlanner, is_pinned
from specdec.engine.prompt_seeds import PromptSeeds
from specdec.engine.runner import Chunk, ChunkOutput, ModelRunner, Rows
from specdec.engine.scheduler import ScheduledBatch, Scheduler, prefill_target
from specdec.engine.sequence import Sequence, Status
from specdec.engine.stopping import StopRules, TextState
from specdec.errors import ConfigError, OutOfBlocksError, PromptTooLongError
from specdec.models.llama import LlamaModel
from specdec.sampling import make_generator, sample, target_probs
from specdec.sampling.logprobs import token_logprobs
from specdec.sampling.processors import processed_rows
from specdec.tree.spec import TreeSpec
from specdec.tree.token_tree import TokenTree
from specdec.verifier import VerifyResult, verify_greedy_batch
from specdec.verifier.select import Rule, rule_for, sampled_rule

StepObserver = Callable[[Sequence, TokenTree, VerifyResult], None]


@dataclass
class _Timing:
    start: float
    proposed: float = 0.0
    committed: float = 0.0
    drafter_after: float = 0.0  # the drafter's bookkeeping after verification: drafting cost, not verify cost


class Engine:
    def __init__(self, model: LlamaModel, tokenizer: Any, config: EngineConfig, drafter: Drafter, tree: TreeSpec,
                 planner: SpeculationPlanner | None = None) -> None:
        self.config = config
        self.drafter = drafter
        self.tree = tree
        # A planner passed in keeps what an earlier engine of the same model and drafter measured.
        self.planner = (planner or SpeculationPlanner()) if config.adaptive_speculation else None
        # Lookup drafters draft for every sequence before the plan, which then picks the nodes worth verifying.
        self.nodes = (NodePlannedDrafting(drafter, tree, self.planner)
                      if self.planner is not None and drafter.plans_by_node else None)
        # This step's (deepest depth, sequences drafting, proposing seconds), when the depth plan drafted.
        self._drafted: tuple[int, int, float] | None = None
        self.runner = ModelRunner.create(model, config.num_blocks, config.block_size,
                                         prefix_caching=config.enable_prefix_caching,
                                         kv_cache_dtype=config.kv_cache_dtype,
                                         graph_tokens=config.cuda_graph_tokens)
        self.scheduler = Scheduler(config, self.runner.cache)
        self.seeds = PromptSeeds(drafter, model.lm_head)
        # True while no request can arrive (LLM.generate after adding its batch; never in the server): once
        # none waits for a slot either, the planner plans for the end of the batch (`SpeculationPlanner._plan_closed`).
        self.arrivals_closed = False
        self.max_len = model.config.max_position
        self.vocab_size = model.config.vocab_size
        eos = set(model.config.eos_token_ids)
        if getattr(tokenizer, "eos_token_id", None) is not None:
            eos.add(int(tokenizer.eos_token_id))
        self.stops = StopRules(tokenizer, frozenset(eos), self.max_len)
        self._ids = itertools.count()
        self._rules: dict[int, Rule] = {}
        self.sequences: dict[int, Sequence] = {}
        # Called as observer(seq, tree, result) after each verified step: experiments record trees and accepted
        # paths here without the engine knowing what they measure.
        self.step_observers: list[StepObserver] = []

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.stops.eos_ids

    # ----------------------------------------------------------------------------------------------- requests
    def add_request(self, prompt_ids: list[int], params: SamplingParams,
                    share_prefix_with: Sequence | None = None) -> Sequence:
        """Queue one sequence. `share_prefix_with`: an earlier sequence of the same prompt (another of its `n`
        samples); this one waits until that one's prompt is in the cache, then reuses its full blocks through
        the prefix cache instead of computing them again."""
        if params.n != 1:
            raise ConfigError("the engine runs one sample per sequence: expand n with "
                              "specdec.sampling.seeds.per_sample (LLM.generate and the server do)", field="n")
        self.check_request(prompt_ids, params)
        seq = Sequence(next(self._ids), list(prompt_ids), params, make_generator(params.seed, self.runner.device),
                       text=TextState(), prefix_leader=share_prefix_with)
        self._rules[seq.seq_id] = rule_for(params, self.config)
        self.sequences[seq.seq_id] = seq
        self.scheduler.add(seq)
        return seq

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raise what `add_request` would raise for this request, adding nothing (batch callers check each
        record first, so one bad record does not stop the rest)."""
        vocab = self.vocab_size
        for name, ids in (("logit_bias", [t for t, _ in params.logit_bias]), ("stop_token_ids", params.stop_token_ids)):
            bad = next((t for t in ids if t >= vocab), None)
            if bad is not None:
                raise ConfigError(f"{name}: token id {bad} is outside the model's vocabulary (0 to {vocab - 1})",
                                  field=name)
        if not prompt_ids:
            raise PromptTooLongError("the prompt is empty: give at least one token")
        if len(prompt_ids) >= self.max_len:
            raise PromptTooLongError(
                f"the prompt has {len(prompt_ids)} tokens, but the model's context is {self.max_len} tokens "
                "(and at least one must be left to generate into)"
            )
        worst = min(len(prompt_ids) + params.max_new_tokens, self.max_len) + self.tree.max_nodes
        if self.scheduler.capacity_tokens < worst:
            raise OutOfBlocksError(
                f"this request needs up to {worst} tokens of KV cache but the engine holds only "
                f"{self.scheduler.capacity_tokens}; raise kv_cache_tokens"
            )

    def abort(self, seq_id: int) -> None:
        seq = self.sequences.get(seq_id)
        if seq is not None and not seq.is_finished:
            self._finish(seq, "abort")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # ---------------------------------------------------------------------------------------------------- step
    def step(self) -> list[Sequence]:
        """Run one engine step; returns the sequences that emitted tokens or finished in it."""
        batch = self._schedule()
        if batch is None:
            return []
        timing = _Timing(time.perf_counter())
        trees = self._propose(batch)
        timing.proposed = time.perf_counter()
        prefill_outs, tree_outs = self._forward(batch, trees)
        rows = self._processed(batch.decodes, trees, tree_outs)
        self._check_finite(batch.decodes, prefill_outs, tree_outs, rows)
        results = self._verify(batch.decodes, trees, rows, tree_outs)  # NaN in what it reads: raises, nothing emitted
        touched = self._finish_prefills(batch, prefill_outs)
        self._commit(batch.decodes, trees, tree_outs, results, timing)
        timing.committed = time.perf_counter()
        self._observe(batch, trees, results, timing)
        for seq, result, row in zip(batch.decodes, results, rows):
            kept = self._emit(seq, result.tokens)
            seq.metrics.step_accepts.append(kept)  # tau counts the tokens a step emitted, not those a stop cut off
            if seq.params.logprobs is not None and kept:
                seq.logprobs.extend(token_logprobs(row[result.accepted_nodes[:kept]], result.tokens[:kept],
                                                   seq.params))
            touched.append(seq)
        return touched

    def _schedule(self) -> ScheduledBatch | None:
        batch = self.scheduler.schedule(self.tree.max_nodes)
        if batch.preempted:
            self.drafter.release(batch.preempted)
            self.seeds.forget(batch.preempted)
        if not batch.empty:
            return batch
        if batch.preempted or not self.scheduler.running:
            return None
        raise OutOfBlocksError("the KV cache cannot hold even one running sequence; raise kv_cache_tokens")

    def _propose(self, batch: ScheduledBatch) -> list[TokenTree]:
        """Trees for the decoding sequences: the drafter's, cut to the planner's depth and to the context."""
        seqs = batch.decodes
        if not seqs:
            return []
        if self.planner is None:
            self.seeds.hand_over(seqs)
            trees = self.drafter.propose(seqs, self.tree)
        else:
            trees = self._planned_trees(seqs, sum(n for _, n in batch.prefills))
        return [tree.cut(self.max_len - seq.table.length - 1) for seq, tree in zip(seqs, trees)]

    def _planned_trees(self, seqs: list[Sequence], prefill_tokens: int) -> list[TokenTree]:
        if self.nodes is not None:
            self.seeds.hand_over(seqs, len(seqs))
            return self.nodes.trees(seqs, prefill_tokens)
        # Closed: no request can arrive, and every waiting one will get a slot (it waits for prefill budget, not
        # for a sequence to finish), so finishing early frees nothing anyone uses.
        waiting, running = self.scheduler.waiting, self.scheduler.running
        closed = self.arrivals_closed and len(running) + len(waiting) <= self.config.max_num_seqs
        waiting_left = 0  # the most tokens to go of a sequence not yet decoding (closed batches only)
        if closed:
            starting = list(waiting) + [s for s in running if s.num_computed < prefill_target(s)]
            waiting_left = max((s.params.max_new_tokens - len(s.output_ids) for s in starting), default=0)
        depths = self.planner.plan(seqs, self.tree, prefill_tokens, closed=closed, waiting_left=waiting_left)
        drafting = [seq for seq, d in zip(seqs, depths) if d > 0]
        trees: dict[int, TokenTree] = {}
        if drafting:
            deepest = max(depths)
            # A sequence's first draft also hands the drafter its whole prompt (a draft model's prefill of it, a
            # suffix trie's indexing): a once-per-request cost, not a price per depth. Priced in, it made a
            # 0.5B draft look 4x dearer than it is, and the plan went without speculation for EXPLORE_AFTER steps.
            first = any(not seq.metrics.proposed_by_depth for seq in drafting)
            self.seeds.hand_over(drafting, len(seqs))  # once a request: before the clock, like the first proposal
            start = time.perf_counter()
            proposed = self.drafter.propose(drafting, self.tree.limited(deepest))
            if not first:
                self._drafted = (deepest, len(drafting), time.perf_counter() - start)
            trees = {seq.seq_id: tree for seq, tree in zip(drafting, proposed)}
        return [trees[seq.seq_id].cut(d) if d > 0 else TokenTree.chain([seq.last_token])
                for seq, d in zip(seqs, depths)]

    def _forward(self, batch: ScheduledBatch, trees: list[TokenTree]) -> tuple[list[ChunkOutput], list[ChunkOutput]]:
        """ONE target pass over every prefill chunk and every tree; outputs split back into the two groups."""
        chunks = [self._prefill_chunk(seq, n) for seq, n in batch.prefills]
        chunks += [Chunk(seq.table, tree.token_list, tree.positions(seq.table.length).tolist(),
                         None if tree.is_chain else tree.ancestor_mask, Rows.ALL)
                   for seq, tree in zip(batch.decodes, trees)]
        hidden = self.drafter.needs_features or self.seeds.needs_hidden(bool(batch.prefills))
        outs = self.runner.run(chunks, return_hidden=hidden,
                               capture_layers=self.drafter.feature_layers)
        return outs[: len(batch.prefills)], outs[len(batch.prefills):]

    def _check_finite(self, seqs: list[Sequence], prefill_outs: list[ChunkOutput], tree_outs: list[ChunkOutput],
                      rows: list[Tensor]) -> None:
        """NaN/Inf logits stop the step with a clear error, not token 0: every output is checked before anything
        reads it, except the rows that greedy verification reads unprocessed, which its argmax checks on its
        one pass over them for NaN and +Inf, all that could change its tokens (a second pass here cost 0.13 ms of
        a 7-row tree step: the rows had left the cache)."""
        checked = [out for seq, out, row in zip(seqs, tree_outs, rows)
                   if not (self._rules[seq.seq_id] is Rule.GREEDY and row is out.logits)]
        check_finite_logits(prefill_outs + checked)

    def _prefill_chunk(self, seq: Sequence, n: int) -> Chunk:
        """A prefill chunk's rows of logits: the last one where the prompt ends (its first token), and, unless
        `PromptSeeds` defers them to the first draft, those the drafter reads among the prompt's last
        `prefill_logit_rows` positions (each is an LM-head row: a drafter asks only for the rows it will use)."""
        start = seq.num_computed
        end = start + n
        seeded = 0 if self.seeds.deferred else self._seeded_rows(seq, start, end)
        tail = max(seeded, 1 if end == prefill_target(seq) and not seq.output_ids else 0)
        return Chunk(seq.table, seq.token_ids[start:end], list(range(start, end)), None,
                     Rows.LAST if tail else Rows.NONE, tail=tail)

    def _seeded_rows(self, seq: Sequence, start: int, end: int) -> int:
        """How many of positions start .. end - 1 lie in the prompt's last `prefill_logit_rows` (seed rows)."""
        return max(0, end - max(start, prefill_target(seq) - self.drafter.prefill_logit_rows))

    def _finish_prefills(self, batch: ScheduledBatch, outs: list[ChunkOutput]) -> list[Sequence]:
        """Hand prefill features to the drafter; a sequence whose prompt is done draws its first token."""
        touched = []
        for (seq, n), out in zip(batch.prefills, outs):
            self.drafter.observe_prefill(seq, out.prefix_len, out.hidden)
            if self.seeds.deferred:  # the chunk's seed rows: hidden states now, logits at the first draft
                rows = self._seeded_rows(seq, out.prefix_len, out.prefix_len + n)
                self.seeds.keep(seq, out.prefix_len + n - rows, out.hidden[n - rows:])
            elif self.drafter.prefill_logit_rows and out.logits is not None:  # the chunk's last rows
                rows = int(out.logits.shape[0])
                self.drafter.observe_prefill_logits(seq, out.prefix_len + n - rows, out.logits)
            self.scheduler.prefilled(seq)
            if seq.num_computed == prefill_target(seq) and not seq.output_ids:
                self._emit(seq, [self._first_token(seq, out.logits[-1])])
                touched.append(seq)
        return touched

    def _first_token(self, seq: Sequence, logits: Tensor) -> int:
        params = seq.params
        row = processed_rows(logits[None], params, seq.prompt_ids, seq.output_ids, None, self.eos_ids)
        token = int(row[0].argmax()) if params.greedy else sample(target_probs(row, params)[0], seq.generator)
        if params.logprobs is not None:
            seq.logprobs.extend(token_logprobs(row, [token], params))
        return token

    def _processed(self, seqs: list[Sequence], trees: list[TokenTree], outs: list[ChunkOutput]) -> list[Tensor]:
        """Each tree's target logits with the controls that depend on the tokens before a row (penalties,
        logit_bias, min_new_tokens) applied per node, from the committed tokens plus the node's path."""
        return [processed_rows(out.logits, seq.params, seq.prompt_ids, seq.output_ids, tree, self.eos_ids)
                for seq, tree, out in zip(seqs, trees, outs)]

    def _verify(self, seqs: list[Sequence], trees: list[TokenTree], rows: list[Tensor],
                outs: list[ChunkOutput]) -> list[VerifyResult]:
        """Greedy sequences in one batched pass; sampled ones by their rule, each with its own generator."""
        results: list[VerifyResult | None] = [None] * len(seqs)
        greedy = [i for i, seq in enumerate(seqs) if self._rules[seq.seq_id] is Rule.GREEDY]
        for i, result in zip(greedy, verify_greedy_batch([trees[i] for i in greedy], [rows[i] for i in greedy])):
            results[i] = result
        for i, seq in enumerate(seqs):
            if results[i] is None:
                verify = sampled_rule(self._rules[seq.seq_id], self.config)
                results[i] = verify(trees[i], rows[i], seq.params, seq.generator)
        if self.drafter.needs_features:
            results = [replace(r, hidden=out.hidden[r.accepted_nodes]) for r, out in zip(results, outs)]
        return results  # type: ignore[return-value]

    def _commit(self, seqs: list[Sequence], trees: list[TokenTree], outs: list[ChunkOutput],
                results: list[VerifyResult], timing: _Timing) -> None:
        """Keep each accepted path's K/V (rollback of the rest), then let the drafter advance or roll back."""
        for seq, out, result in zip(seqs, outs, results):
            self.runner.commit_path(seq.table, out.prefix_len, result.accepted_nodes)
            self.scheduler.committed(seq)
        if not seqs:
            return
        start = time.perf_counter()
        # Token Recycling reuses every node's logits, hybrids calibrate; not while speculation is off for all.
        idle = self.planner is not None and self.planner.idle and all(len(tree) == 1 for tree in trees)
        if self.drafter.observes_verification and not idle:
            self.drafter.observe_verified(seqs, trees, [out.logits for out in outs], results)
        self.drafter.commit(seqs, results)
        timing.drafter_after = time.perf_counter() - start

    def _observe(self, batch: ScheduledBatch, trees: list[TokenTree], results: list[VerifyResult],
                 timing: _Timing) -> None:
        draft_s = timing.proposed - timing.start + timing.drafter_after
        verify_s = timing.committed - timing.proposed - timing.drafter_after
        if self.planner is not None:  # the whole verify side: forward, verification, KV commit, drafter commit
            prefill_tokens = sum(n for _, n in batch.prefills)
            self.planner.observe_forward(prefill_tokens + sum(len(tree) for tree in trees),
                                         timing.committed - timing.proposed, prefill_tokens=prefill_tokens)
        if self.nodes is not None:
            self.nodes.observe(batch.decodes, trees, results, timing.drafter_after)
        elif self._drafted is not None:  # a speculative step of the depth plan: its drafting, what it gained
            # Drafting is the proposing plus the drafter's reading of the verified step (Token Recycling's top-k
            # of every verified row, a hybrid's calibration): about as dear as the proposing
            # (`bench/step_log.py`), so priced in both the per-depth curve and the measured gain.
            depth, drafting, proposing = self._drafted
            draft_seconds = proposing + timing.drafter_after
            self.planner.observe_draft(depth, draft_seconds, drafting)
            self.planner.observe_gain(len(trees), sum(len(tree) - 1 for tree in trees),
                                      sum(result.num_accepted_drafts for result in results), draft_seconds,
                                      pinned=any(map(is_pinned, batch.decodes)))
        self._drafted = None
        for seq, tree, result in zip(batch.decodes, trees, results):
            self._record(seq, tree, result, draft_s, verify_s)
            if self.planner is not None:
                self.planner.observe_step(int(tree.depth.max()), result.num_accepted_drafts)
            for observer in self.step_observers:
                observer(seq, tree, result)

    def _record(self, seq: Sequence, tree: TokenTree, result: VerifyResult, draft_s: float, verify_s: float) -> None:
        m = seq.metrics
        m.draft_time_s += draft_s
        m.verify_time_s += verify_s
        depth = int(tree.depth.max())
        while len(m.proposed_by_depth) < depth:
            m.proposed_by_depth.append(0)
            m.accepted_by_depth.append(0)
        for d in range(depth):
            m.proposed_by_depth[d] += 1
            m.accepted_by_depth[d] += int(result.num_accepted_drafts > d)
        m.accepted_drafts += result.num_accepted_drafts
        accepted = result.accepted_nodes[1:]
        if tree.source is not None:  # several drafters built the tree: remember who proposed each accepted token
            names = self.drafter.source_names
            labels = [names[s] for s in tree.source[accepted].tolist()] if accepted else []
            base = len(seq.output_ids)
            for j, label in enumerate(labels):
                m.source_of[base + j] = label
        else:
            labels = [self.drafter.name] * len(accepted)
        for label in labels:
            m.accepted_by_source[label] = m.accepted_by_source.get(label, 0) + 1

    # ------------------------------------------------------------------------------------------- stop checks
    def _emit(self, seq: Sequence, tokens: list[int]) -> int:
        """Append tokens up to the first stop (EOS, length, stop string); returns how many were kept."""
        if seq.metrics.first_token_time is None:
            seq.metrics.first_token_time = time.perf_counter()
        kept, reason = self.stops.append(seq.text, seq.output_ids, tokens, seq.params, len(seq.prompt_ids))
        if reason is not None:
            self._finish(seq, reason)
        return kept

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.metrics.finish_time = time.perf_counter()
        self.stops.finish(seq.text, seq.output_ids)
        self.scheduler.remove(seq)
        self.drafter.release([seq])
        self.seeds.forget([seq])
        self._rules.pop(seq.seq_id, None)
        self.sequences.pop(seq.seq_id, None)  # the caller holds it; a long-lived engine must not keep every request

    def token_text(self, token: int) -> str:
        """One token's own text, special tokens included (what logprobs name a token by)."""
        return self.stops.tokenizer.decode([token], skip_special_tokens=False)

    def output_text(self, seq: Sequence) -> str:
        """The request's text so far (up to a matched stop string), decoding only what is new."""
        self.stops.decode(seq.text, seq.output_ids, final=seq.is_finished)
        return seq.text.visible(seq.params.stop, seq.is_finished)
