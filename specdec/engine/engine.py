"""The engine step: schedule, draft, one target pass, verify, commit, stop checks.

    waiting ─► Scheduler ─► prefill chunks + decoding sequences
    Drafter.propose ─► one TokenTree per decoding sequence
    ONE target forward over every chunk and every tree node (tree-masked attention over the paged cache)
    verify (greedy or lossless rejection sampling) ─► accepted path + bonus token per sequence
    KV commit (compact accepted path, truncate the rest) ─► Drafter.commit ─► stop checks ─► outputs

Plain decode is the same step with the `none` drafter, whose trees are just the root.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from typing import Any, Callable

import torch

from specdec.engine.planner import SpeculationPlanner
from specdec.config import EngineConfig, SamplingParams
from specdec.drafters.base import Drafter
from specdec.errors import OutOfBlocksError, PromptTooLongError
from specdec.models.llama import LlamaModel
from specdec.engine.runner import Chunk, ModelRunner
from specdec.sampling import make_generator, sample, target_probs
from specdec.engine.scheduler import Scheduler, prefill_target
from specdec.engine.sequence import Sequence, Status
from specdec.tree.token_tree import TokenTree
from specdec.tree.spec import TreeSpec
from specdec.verifier import VerifyResult, verify_greedy, verify_stochastic


class Engine:
    def __init__(self, model: LlamaModel, tokenizer: Any, config: EngineConfig, drafter: Drafter, tree: TreeSpec,
                 planner: SpeculationPlanner | None = None) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.drafter = drafter
        self.tree = tree
        # A planner passed in keeps what an earlier engine of the same model and drafter measured.
        self.planner = (planner or SpeculationPlanner()) if config.adaptive_speculation else None
        self.runner = ModelRunner.create(model, config.num_blocks, config.block_size,
                                         prefix_caching=config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.runner.cache)
        self.max_len = model.config.max_position
        eos = set(model.config.eos_token_ids)
        if getattr(tokenizer, "eos_token_id", None) is not None:
            eos.add(int(tokenizer.eos_token_id))
        self.eos_ids = frozenset(eos)
        self._ids = itertools.count()
        self.sequences: dict[int, Sequence] = {}
        # Called as observer(seq, tree, result) after each verified step: experiments record trees and accepted
        # paths here without the engine knowing what they measure.
        self.step_observers: list[Callable[[Sequence, TokenTree, VerifyResult], None]] = []
        self._prefill_logits = bool(getattr(drafter, "wants_prefill_logits", False))

    # ----------------------------------------------------------------------------------------------- requests
    def add_request(self, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        if not prompt_ids:
            raise PromptTooLongError("the prompt is empty: give at least one token")
        if len(prompt_ids) >= self.max_len:
            raise PromptTooLongError(
                f"the prompt has {len(prompt_ids)} tokens, but the model's context is {self.max_len} tokens "
                "(and at least one must be left to generate into)"
            )
        worst = min(len(prompt_ids) + params.max_new_tokens, self.max_len) + self.tree.max_nodes
        if self.runner.cache.pool.num_blocks * self.config.block_size < worst:
            raise OutOfBlocksError(
                f"this request needs up to {worst} tokens of KV cache but the engine holds only "
                f"{self.runner.cache.pool.num_blocks * self.config.block_size}; raise kv_cache_tokens"
            )
        seq = Sequence(next(self._ids), list(prompt_ids), params, make_generator(params.seed, self.runner.device))
        self.sequences[seq.seq_id] = seq
        self.scheduler.add(seq)
        return seq

    def abort(self, seq_id: int) -> None:
        seq = self.sequences.get(seq_id)
        if seq is not None and not seq.is_finished:
            self._finish(seq, "abort")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # ---------------------------------------------------------------------------------------------------- step
    def step(self) -> list[Sequence]:
        """Run one engine step; returns the sequences that emitted tokens or finished in it."""
        batch = self.scheduler.schedule(self.tree.max_nodes)
        if batch.preempted:
            self.drafter.release(batch.preempted)
        if batch.empty:
            if batch.preempted or not self.scheduler.running:
                return []
            raise OutOfBlocksError("the KV cache cannot hold even one running sequence; raise kv_cache_tokens")
        t0 = time.perf_counter()
        trees = [self._fit_context(seq, tree) for seq, tree in zip(batch.decodes, self._propose(batch))]
        t1 = time.perf_counter()
        chunks = [self._prefill_chunk(seq, n) for seq, n in batch.prefills]
        chunks += [
            Chunk(seq.table, tree.tokens.tolist(), tree.positions(seq.table.length).tolist(),
                  None if tree.is_chain else tree.ancestor_mask, "all")
            for seq, tree in zip(batch.decodes, trees)
        ]
        features = self.drafter.needs_hidden_states
        outs = self.runner.run(chunks, return_hidden=features,
                               capture_layers=tuple(getattr(self.drafter, "feature_layers", ()) or ()))
        touched: list[Sequence] = []
        for (seq, n), out in zip(batch.prefills, outs):
            if features:  # a feature drafter builds its own state from the target's features over the prompt
                self.drafter.observe_prefill(seq, seq.num_computed, out.hidden)
            if self._prefill_logits:  # Token Recycling seeds its matrix from the prompt's logits
                self.drafter.observe_prefill_logits(seq, seq.num_computed, out.logits)
            seq.num_computed += n
            self._cache_full_blocks(seq)
            if seq.num_computed == prefill_target(seq) and not seq.output_ids:
                self._emit(seq, [self._first_token(seq, out.logits[-1])])
                touched.append(seq)
        results = []
        for seq, tree, out in zip(batch.decodes, trees, outs[len(batch.prefills):]):
            result = self._verify(seq, tree, out.logits)
            if out.hidden is not None:
                result = replace(result, hidden=out.hidden[result.accepted_nodes])
            self.runner.commit_path(seq.table, out.prefix_len, result.accepted_nodes)
            seq.num_computed = seq.table.length
            self._cache_full_blocks(seq)
            results.append(result)
        drafter_s = time.perf_counter()
        if batch.decodes and getattr(self.drafter, "observes_verification", False):
            # Token Recycling reuses the target's logits at every node; hybrids calibrate on what was accepted.
            self.drafter.observe_verified(batch.decodes, trees, [out.logits for out in outs[len(batch.prefills):]],
                                          results)
        if batch.decodes:
            self.drafter.commit(batch.decodes, results)
        t2 = time.perf_counter()
        drafter_s = t2 - drafter_s  # the drafter's bookkeeping after verification counts as drafting cost
        if self.planner is not None:  # the whole verify side: forward, verification, KV commit, drafter commit
            self.planner.observe_forward(sum(len(c.tokens) for c in chunks), t2 - t1,
                                         prefill_tokens=sum(n for _, n in batch.prefills))
        for seq, tree, result in zip(batch.decodes, trees, results):
            self._record(seq, tree, result, t1 - t0 + drafter_s, t2 - t1 - drafter_s)
            if self.planner is not None:
                self.planner.observe_step(int(tree.depth.max()), result.num_accepted_drafts)
            for observer in self.step_observers:
                observer(seq, tree, result)
            self._emit(seq, result.tokens)
            touched.append(seq)
        return touched

    def _propose(self, batch) -> list[TokenTree]:
        """Trees for the decoding sequences: the drafter's, cut to the planner's depth for each sequence."""
        seqs = batch.decodes
        if not seqs:
            return []
        if self.planner is None:
            return self.drafter.propose(seqs, self.tree)
        depths = self.planner.plan(seqs, self.tree, sum(n for _, n in batch.prefills))
        drafting = [seq for seq, d in zip(seqs, depths) if d > 0]
        trees: dict[int, TokenTree] = {}
        if drafting:
            deepest = max(depths)
            start = time.perf_counter()
            proposed = self.drafter.propose(drafting, self.tree.limited(deepest))
            self.planner.observe_draft(deepest, time.perf_counter() - start, len(drafting))
            trees = {seq.seq_id: tree for seq, tree in zip(drafting, proposed)}
        return [trees[seq.seq_id].cut(d) if d > 0 else TokenTree.chain([seq.last_token])
                for seq, d in zip(seqs, depths)]

    def _cache_full_blocks(self, seq: Sequence) -> None:
        prefix = self.runner.cache.prefix
        if prefix is not None and len(seq.table.cached) < seq.table.length // self.config.block_size:
            prefix.register(seq.table, seq.token_ids)

    def _prefill_chunk(self, seq: Sequence, n: int) -> Chunk:
        start = seq.num_computed
        done = start + n == prefill_target(seq)
        rows = "all" if self._prefill_logits else "last" if done and not seq.output_ids else "none"
        return Chunk(seq.table, seq.token_ids[start: start + n], list(range(start, start + n)), None, rows)

    def _fit_context(self, seq: Sequence, tree: TokenTree) -> TokenTree:
        """Drop tree nodes whose position would pass the model's context."""
        return tree.cut(self.max_len - seq.table.length - 1)  # the deepest depth that still fits

    def _first_token(self, seq: Sequence, logits: torch.Tensor) -> int:
        if seq.params.greedy:
            return int(logits.argmax())
        return sample(target_probs(logits[None], seq.params)[0], seq.generator)

    def _verify(self, seq: Sequence, tree: TokenTree, logits: torch.Tensor) -> VerifyResult:
        if seq.params.greedy:
            return verify_greedy(tree, logits)
        if self.config.acceptance == "typical":
            from specdec.verifier.typical import verify_typical

            return verify_typical(tree, target_probs(logits, seq.params), seq.generator,
                                  self.config.typical_threshold, self.config.typical_alpha)
        return verify_stochastic(tree, target_probs(logits, seq.params), seq.generator)

    def _record(self, seq: Sequence, tree: TokenTree, result: VerifyResult, draft_s: float, verify_s: float) -> None:
        m = seq.metrics
        m.draft_time_s += draft_s
        m.verify_time_s += verify_s
        m.step_accepts.append(len(result.tokens))
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
    def _emit(self, seq: Sequence, tokens: list[int]) -> None:
        if seq.metrics.first_token_time is None:
            seq.metrics.first_token_time = time.perf_counter()
        params = seq.params
        for token in tokens:
            seq.output_ids.append(token)
            if token in self.eos_ids and not params.ignore_eos:
                return self._finish(seq, "stop")
            if len(seq.output_ids) >= params.max_new_tokens or seq.num_tokens >= self.max_len:
                return self._finish(seq, "length")
        if params.stop and self._hit_stop_string(seq):
            self._finish(seq, "stop")

    def _hit_stop_string(self, seq: Sequence) -> bool:
        text = self.tokenizer.decode(seq.output_ids, skip_special_tokens=True)
        longest = max(len(s) for s in seq.params.stop)
        start = max(0, seq.stop_checked_len - longest)
        seq.stop_checked_len = len(text)
        hits = [i for i in (text.find(s, start) for s in seq.params.stop) if i >= 0]
        if not hits:
            return False
        seq.text_end = min(hits)
        return True

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.metrics.finish_time = time.perf_counter()
        self.scheduler.remove(seq)
        self.drafter.release([seq])

    def output_text(self, seq: Sequence) -> str:
        text = self.tokenizer.decode(seq.output_ids, skip_special_tokens=True)
        return text if seq.text_end is None else text[: seq.text_end]
