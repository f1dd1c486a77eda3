"""`oracle:alpha=0.8[,k=5][,cost=<seconds>][,seed=0]`: a drafter with a known acceptance rate, for systems
benchmarks.

It proposes the target's *own* greedy continuation and corrupts each drafted token with probability 1 - alpha
(replacing it by a different, random token). Under greedy verification every drafted node is therefore
accepted with probability exactly alpha given its parent was, so the engine's speedup can be measured at a
chosen alpha, on any target, including `dummy:` targets with random weights where no real drafter can work.
(Under sampling, a node is accepted with probability alpha times the target's probability of its greedy
token; the output stays lossless, since every proposal is one-hot.)

Where the greedy continuation comes from:
* `prepare(prompt_ids, num_tokens)` (or `prepare_oracle(llm, prompts, max_new_tokens)`) runs plain greedy
  decode of the prompts in a private KV cache on the same model object, before anything is timed, and keeps
  the result per prompt (keyed by the prompt's token ids). Proposing is then a
  lookup: it costs no model call.
* A sequence without a reference, or whose output has left its reference (sampling, a near-tie that batched
  verification rounds the other way), or that needs tokens past the end of its reference, gets the missing
  tokens from the target itself: plain greedy decode in the drafter's own KV cache (created on first use),
  resumed from where it stopped. That time is draft time, as it should be. Correctness never depends on
  `prepare`; only draft time does.

Tree shapes: the oracle's tokens form the rank-0 path (`(0,), (0, 0), ...`). Other nodes of a static or
dynamic tree are fillers: random tokens that are never the target's greedy token at the filler's position
under an oracle node, so they cost verification work like a real tree but never change the acceptance rate.
`dynamic:depth=D,topk=K,budget=B` becomes the rank-0 path of depth min(D, B) plus rank-1, rank-2, ... siblings
along it, nearest the root first, up to B nodes.

`cost=<seconds>` simulates a draft model's latency: each `propose` waits `cost` seconds per draft forward a
real drafter would need, that is, per depth level of the proposed tree (a chain of k tokens is k sequential
forwards; one forward serves the whole batch). The wait sleeps and then spins for its last millisecond, so
sub-millisecond costs are honoured.
"""

from __future__ import annotations

import random
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from specdec.config import EngineConfig
from specdec.drafters.base import DrafterBase, DrafterContext
from specdec.drafters.model_drafter import spare_blocks
from specdec.drafters.registry import float_arg, int_arg, register, reject_unknown
from specdec.engine.runner import Chunk, ModelRunner, Rows
from specdec.engine.sequence import Sequence
from specdec.errors import ConfigError
from specdec.kvcache import BlockTable
from specdec.models.llama import LlamaModel
from specdec.tree.growth import choice_layout
from specdec.tree.spec import Choice, TreeKind, TreeSpec, chain, choices_of
from specdec.tree.token_tree import TokenTree


@dataclass
class _State:
    rng: random.Random
    ref: list[int] | None = None  # the known greedy token sequence this sequence follows (prompt first)
    table: BlockTable = field(default_factory=BlockTable)  # fallback decode's cache (when the reference runs out)


class OracleDrafter(DrafterBase):
    name = "oracle"

    def __init__(self, target: Any, engine: EngineConfig, alpha: float, k: int = 5, cost: float = 0.0,
                 seed: int = 0) -> None:
        self.target = target  # LoadedModel: the model whose greedy continuation we propose
        self.engine_config = engine
        self.alpha, self.k, self.cost, self.seed = alpha, k, cost, seed
        self.references: dict[tuple[int, ...], list[int]] = {}  # prompt ids -> greedy continuation
        self._runner: ModelRunner | None = None  # fallback greedy decode, created on first use
        self._layouts: dict[TreeSpec, tuple[list[int], list[int], list[bool]]] = {}

    @property
    def model(self) -> LlamaModel:
        return self.target.model

    def default_tree(self) -> TreeSpec:
        return chain(self.k)

    # ----------------------------------------------------------------------------------------- references
    def prepare(self, prompt_ids: list[list[int]], num_tokens: int) -> None:
        """Record the target's greedy continuation (`num_tokens` tokens) of every prompt, untimed.

        Give `max_new_tokens` plus the tree depth, so that proposals in the last steps are covered too.
        """
        todo = [list(p) for p in {tuple(p): None for p in prompt_ids} if self._covered(p) < num_tokens]
        if not todo:
            return
        cfg = self.engine_config
        block = cfg.block_size
        needed = sum(-(-(len(p) + num_tokens + 1) // block) for p in todo)
        # a private cache only this big, at the engine's precision: the continuation is the target's as served
        runner = ModelRunner.create(self.model, needed, block, kv_cache_dtype=cfg.kv_cache_dtype)
        refs = [list(p) for p in todo]
        limit = self.model.config.max_position
        greedy_decode(runner, refs, [BlockTable() for _ in todo], [min(len(p) + num_tokens, limit) for p in todo])
        for prompt, ref in zip(todo, refs):
            self.references[tuple(prompt)] = ref[len(prompt):]

    def _covered(self, prompt: tuple[int, ...]) -> int:
        return len(self.references.get(tuple(prompt), ()))

    # ------------------------------------------------------------------------------------------- protocol
    def _state(self, seq: Sequence) -> _State:
        """Per-sequence state; the corruption stream is per sequence, so it does not depend on the batch."""
        def make() -> _State:
            key = f"{self.seed}:{','.join(map(str, seq.prompt_ids))}".encode()
            return _State(random.Random(zlib.crc32(key) ^ (self.seed << 32)))
        return self.slot(seq, make)

    def free(self, state: object) -> None:
        if isinstance(state, _State) and self._runner is not None:
            self._runner.cache.free(state.table)

    def propose(self, seqs: list[Sequence], spec: TreeSpec) -> list[TokenTree]:
        start = time.perf_counter()
        depths, parents, main = self._layout(spec)
        depth = sum(main) - 1  # oracle tokens on the rank-0 path (the root is counted in `main`)
        truth = self._continuations(seqs, depth)
        vocab = self.model.config.vocab_size
        trees = []
        for seq, true in zip(seqs, truth):
            rng = self._state(seq).rng
            node_tokens = [seq.last_token]
            for i in range(1, len(depths)):
                d = depths[i]
                if main[i]:
                    node_tokens.append(true[d - 1] if rng.random() < self.alpha else _other(rng, vocab, true[d - 1]))
                else:
                    avoid = true[d - 1] if d <= depth and main[parents[i]] else -1
                    node_tokens.append(_other(rng, vocab, avoid))
            trees.append(TokenTree.from_parents(node_tokens, parents))
        if self.cost > 0:
            _wait_until(start + self.cost * max(depths))
        return trees

    # ---------------------------------------------------------------------------------------------- trees
    def _layout(self, spec: TreeSpec) -> tuple[list[int], list[int], list[bool]]:
        """(depth per node, parents, on-the-rank-0-path per node) for a spec; node 0 is the root."""
        if spec not in self._layouts:
            choices = tuple(_choices(spec))
            layout = choice_layout(choices, max((len(c) for c in choices), default=0), 1 + max(
                (c[-1] for c in choices), default=0))
            ordered = sorted(choices, key=lambda c: (len(c), c))
            depths = [0] + [len(c) for c in ordered]
            main = [True] + [not any(c) for c in ordered]
            self._layouts[spec] = (depths, layout.parents, main)
        return self._layouts[spec]

    # ------------------------------------------------------------------------------------ continuations
    def _continuations(self, seqs: list[Sequence], n: int) -> list[list[int]]:
        """The target's greedy next `n` tokens after each sequence (filler past the model's context)."""
        short = []
        for seq in seqs:
            ref = self._synced_reference(seq)
            if len(ref) < seq.num_tokens + n and len(ref) < self.model.config.max_position:
                short.append(seq)
        if short:
            self._extend(short, n)
        out = []
        for seq in seqs:
            ref = self._state(seq).ref
            ahead = ref[seq.num_tokens: seq.num_tokens + n]
            out.append(ahead + [0] * (n - len(ahead)))  # only past the context, where the engine drops nodes
        return out

    def _synced_reference(self, seq: Sequence) -> list[int]:
        """The known greedy token sequence that starts with this sequence's tokens (re-based if it left it)."""
        state = self._state(seq)
        ref = state.ref
        if ref is None:
            ref = state.ref = list(seq.prompt_ids) + list(self.references.get(tuple(seq.prompt_ids), ()))
        prompt_len, out = len(seq.prompt_ids), seq.output_ids
        if ref[prompt_len: prompt_len + len(out)] != out:  # left the reference, or the reference is too short
            known = ref[prompt_len:]
            same = 0
            while same < min(len(known), len(out)) and known[same] == out[same]:
                same += 1
            ref = state.ref = list(seq.token_ids)
            table = state.table
            if self._runner is not None:  # keep the K/V of the shared prefix; the last token never has K/V yet
                self._runner.cache.truncate(table, min(table.length, prompt_len + same, len(ref) - 1))
        return ref

    def _extend(self, seqs: list[Sequence], n: int) -> None:
        """Greedy-decode with the target until each sequence's reference reaches `n` tokens past it."""
        limit = self.model.config.max_position
        states = [self._state(seq) for seq in seqs]
        greedy_decode(self._fallback_runner(), [s.ref for s in states], [s.table for s in states],
                      [min(seq.num_tokens + n, limit) for seq in seqs])

    def _fallback_runner(self) -> ModelRunner:
        if self._runner is None:
            cfg = self.engine_config
            self._runner = ModelRunner.create(self.model, cfg.num_blocks + spare_blocks(cfg), cfg.block_size,
                                              kv_cache_dtype=cfg.kv_cache_dtype)
        return self._runner


def prepare_oracle(llm: Any, prompts: list, max_new_tokens: int, chat: bool = True) -> None:
    """Give `llm`'s oracle drafter the greedy continuations of `prompts` before a timed run (no-op otherwise).

    `prompts` are what `llm.generate` will get (text, token ids or chat messages, encoded the same way).
    """
    drafter = getattr(llm, "drafter", None)
    if isinstance(drafter, OracleDrafter):
        ids = [llm.encode(p, chat) for p in prompts]
        drafter.prepare(ids, max_new_tokens + llm.tree_spec.depth)


def greedy_decode(runner: ModelRunner, refs: list[list[int]], tables: list[BlockTable], goals: list[int]) -> None:
    """Extend each token list `refs[i]` by the model's greedy tokens until it holds `goals[i]` tokens, with K/V in
    `tables[i]` of the runner's cache (resumed from what the table already holds)."""
    active = [i for i in range(len(refs)) if len(refs[i]) < goals[i]]
    while active:
        chunks = []
        for i in active:
            table, ref = tables[i], refs[i]
            if not runner.cache.can_append(table, len(ref) - table.length):
                raise ConfigError("the oracle drafter's fallback KV cache is full; call prepare() with the "
                                  "prompts first, or raise kv_cache_tokens")
            chunks.append(Chunk(table, ref[table.length:], list(range(table.length, len(ref))), None, Rows.LAST))
        for i, out in zip(active, runner.run(chunks)):
            refs[i].append(int(out.logits[0].argmax()))
        active = [i for i in active if len(refs[i]) < goals[i]]


def _choices(spec: TreeSpec) -> list[Choice]:
    """The oracle's node layout: chains and static trees as listed; a dynamic tree as the rank-0 path plus
    siblings along it, nearest the root first."""
    if spec.kind is not TreeKind.DYNAMIC:
        return list(choices_of(spec))
    depth = min(spec.depth, spec.budget)
    out = [(0,) * d for d in range(1, depth + 1)]
    for rank in range(1, spec.topk):
        for d in range(1, depth + 1):
            if len(out) >= spec.budget:
                return out
            out.append((0,) * (d - 1) + (rank,))
    return out


def _other(rng: random.Random, vocab: int, avoid: int) -> int:
    """A uniformly random token id other than `avoid` (any id when `avoid` is -1)."""
    if avoid < 0:
        return rng.randrange(vocab)
    token = rng.randrange(vocab - 1)
    return token + (token >= avoid)


def _wait_until(deadline: float) -> None:
    left = deadline - time.perf_counter()
    if left > 0.002:
        time.sleep(left - 0.001)
    while time.perf_counter() < deadline:
        pass


@register("oracle")
def _build(args: dict[str, str], ctx: DrafterContext) -> OracleDrafter:
    if "alpha" not in args:
        raise ConfigError("the oracle drafter needs its acceptance rate: oracle:alpha=0.8[,k=5][,cost=0][,seed=0]")
    alpha = float_arg(args, "alpha", 0.8, 0.0, 1.0)
    cost = float_arg(args, "cost", 0.0, 0.0, 60.0)
    k = int_arg(args, "k", 5)
    seed = int_arg(args, "seed", 0, minimum=0)
    reject_unknown("oracle", args)
    return OracleDrafter(ctx.target, ctx.engine, alpha, k=k, cost=cost, seed=seed)
