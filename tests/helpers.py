"""Shared builders for tests: tiny random models of real architectures, and engines around them."""

from __future__ import annotations

import os

import pytest
import torch

from specdec.config import EngineConfig
from specdec.drafters.base import Drafter, DrafterBase
from specdec.drafters.hybrid_merge import ScoredTree
from specdec.engine.engine import Engine
from specdec.models.config import ModelConfig
from specdec.models.loader import build_model
from specdec.models.llama import LlamaModel
from specdec.tree.spec import TreeSpec, chain
from specdec.tree.token_tree import TokenTree


def in_ci() -> bool:
    """CI sets CI=true (GitHub Actions, GitLab, most others)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def skip_unless_ci(reason: str) -> None:
    """Skip a test that needs something this machine lacks (the real model, offline); in CI fail instead, so a
    green CI run always means greedy equivalence, parity and int8 exactness were really checked."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: a real-model test may not be skipped in CI)", pytrace=False)
    pytest.skip(reason)


def tiny_config(vocab: int = 16, layers: int = 2, hidden: int = 32, heads: int = 4, kv_heads: int = 2) -> ModelConfig:
    return ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "vocab_size": vocab, "hidden_size": hidden,
        "intermediate_size": 2 * hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
    })


def tiny_model(seed: int, vocab: int = 16, sharpness: float = 1.0) -> LlamaModel:
    """A random model whose next-token distributions are far from uniform (`sharpness` scales the LM head)."""
    model = build_model(tiny_config(vocab), None, torch.float32, torch.device("cpu"), seed=seed)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed + 1000)
        model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=gen) * sharpness)
        model.embed_tokens.weight.copy_(torch.randn(model.embed_tokens.weight.shape, generator=gen))
    return model


class NoTokenizer:
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def tiny_engine(model: LlamaModel, drafter: Drafter, tree: TreeSpec, **config) -> Engine:
    return Engine(model, NoTokenizer(), EngineConfig(**config), drafter, tree)


class StepClock:
    """A clock for planning tests: a target pass costs `base + per_row * rows` seconds and nothing else takes
    time, so what the planner measures, and so what it decides, is the same on every run. With the machine's
    real clock a noisy VM priced rows at random and a test of the planner's logic failed one CI run in many."""

    def __init__(self, base: float = 0.010, per_row: float = 0.001) -> None:
        self.now, self.base, self.per_row = 0.0, base, per_row

    def perf_counter(self) -> float:
        return self.now

    def install(self, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        from types import SimpleNamespace

        import specdec.engine.engine as engine_module
        import specdec.engine.node_planning as node_planning_module

        for module in (engine_module, node_planning_module):
            monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter=self.perf_counter))
        run = engine.runner.run

        def timed_run(chunks, *args, **kwargs):
            self.now += self.base + self.per_row * sum(len(chunk.tokens) for chunk in chunks)
            return run(chunks, *args, **kwargs)

        monkeypatch.setattr(engine.runner, "run", timed_run)


def run_all(engine: Engine) -> None:
    while engine.has_unfinished():
        engine.step()


class ScriptedDrafter(DrafterBase):
    """Proposes a chain from a known greedy continuation (`continuation[seq_id]`), shifted by `offset` in a
    vocabulary of `vocab` (0 = always right), claiming `score` for every node; counts its proposals."""

    def __init__(self, name: str, continuation: dict[int, list[int]], offset: int, score: float, vocab: int,
                 plans_by_node: bool = False) -> None:
        self.name, self.continuation, self.offset, self.score, self.vocab = name, continuation, offset, score, vocab
        self.plans_by_node = plans_by_node
        self.proposals = 0

    def default_tree(self) -> TreeSpec:
        return chain(2)

    def propose_scored(self, seqs, spec):
        self.proposals += 1
        out = []
        for seq in seqs:
            future = self.continuation[seq.seq_id][len(seq.output_ids):][: spec.depth]
            tokens = [seq.last_token] + [(t + self.offset) % self.vocab for t in future]
            out.append(ScoredTree(tokens, list(range(-1, len(tokens) - 1)), [0.0] + [self.score] * len(future)))
        return out

    def propose(self, seqs, spec):
        """The same chains unscored, for the depth plan (node planning asks only for scored trees)."""
        if seqs and self.plans_by_node:
            raise AssertionError("a node-planned scripted drafter is only asked for scored trees")
        return [TokenTree.chain(scored.tokens) for scored in self.propose_scored(seqs, spec)] if seqs else []
