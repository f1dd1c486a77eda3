"""The machinery of the lossless-sampling test: a tiny target with real drafters, an exact reference computed
apart from the engine, and a goodness-of-fit statistic that can fail.

Kept out of the test module so `tools/lossless_power.py` reports the very statistic the test asserts on.

What is compared. Every request generates HORIZON = DEPTH + 2 tokens from one prompt: the first comes from the
prefill, the rest from verification steps with trees of depth DEPTH, so a fully accepted first tree ends with
its bonus token inside the horizon. The exact probability of every HORIZON-token outcome is worked out from the
target alone: a dense forward (no paged cache, no trees) over every context, and our own float64 temperature,
top-k, top-p and softmax here, never `specdec.sampling.target_probs`, so a bug there cannot hide in a mirror.

The statistic. Pearson chi-square tests of several views of the samples, each against its exact marginal:
the whole HORIZON-token joint, and every pair of adjacent tokens (the first token included). Cells expected
below MIN_EXPECTED = 20 are pooled (the pool grows until it expects 20), and the views are combined by
Bonferroni. The usual rule of thumb (5) is for p-values near 0.05; this test decides near 1e-4, far in the
tail, where cells expected 5-20 times make Pearson's statistic heavier-tailed than chi-square (at 5, a correct
T=0.5 case once scored 8e-6). At 20 the combined p-value of exact samples falls below 1e-3 in 0.11% and
below 1e-4 in 0.02% of 10,000 simulations (`test_the_statistic_is_calibrated_on_exact_samples` checks 0.05). A sample in a cell of exact probability 0 is reported apart:
the test fails on it outright, whatever the chi-square says.
"""

from __future__ import annotations

import copy
import itertools
import math
import random
import sys
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from specdec.config import EngineConfig, SamplingParams
from specdec.engine.engine import Engine
from specdec.engine.planner import SpeculationPlanner
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.medusa import MedusaDrafter
from specdec.drafters.heads.medusa_heads import MedusaHeads
from specdec.drafters.ngram import NgramDrafter
from specdec.models.dense import dense_forward
from specdec.training.eagle import init_predictor
from specdec.tree.spec import TreeSpec, chain, dynamic
from specdec.verifier import rules
from tests.helpers import NoTokenizer, run_all, tiny_model

VOCAB = 8
DEPTH = 3
HORIZON = DEPTH + 2
# The target's greedy continuation of [3, 1, 4] (so n-gram lookups find what the target tends to say next).
PROMPT = [3, 1, 4, 1, 3, 7, 2, 1, 3]
SHARPNESS = 0.3
DRAFT_NOISE = 1.3
EAGLE_NOISE = 0.15
BLOCK_SIZE = 8
MIN_EXPECTED = 20.0  # cells expected fewer times are pooled (see the module docstring)


@dataclass(frozen=True)
class Case:
    drafter: str  # "draft", "eagle", "medusa" or "ngram"
    tree: TreeSpec
    params: SamplingParams  # temperature / top_k / top_p (max_new_tokens and seed are set per request)
    runs: int = 2000
    random_depths: bool = False  # True: a planner cuts each tree to a random depth every step (0 = plain)


@dataclass
class Models:
    target: torch.nn.Module
    draft: torch.nn.Module
    eagle: torch.nn.Module
    medusa: MedusaHeads


def build_models() -> Models:
    """A tiny target and drafters that agree with it often but not always (30-70% acceptance at depth 1).

    The draft model is the target with a noisy LM head. The EAGLE predictor and the Medusa projections are
    fitted by least squares on the target's own sampled continuations (closed form, so no training loop and
    no seed-dependent optimiser): EAGLE's fc maps (token embedding, feature) to the next feature, Medusa head
    d maps a feature to the token d + 2 places ahead."""
    target = tiny_model(seed=0, vocab=VOCAB, sharpness=SHARPNESS)
    draft = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        draft.lm_head.weight.add_(torch.randn(draft.lm_head.weight.shape, generator=gen) * SHARPNESS * DRAFT_NOISE)
    ids, features = _target_rollouts(target, gen)
    return Models(target, draft, _fitted_eagle(target, ids, features), _fitted_medusa(target, ids, features))


@torch.inference_mode()
def _target_rollouts(target, gen: torch.Generator, runs: int = 1024, length: int = HORIZON + 2):
    """Continuations of PROMPT sampled from the target at T=1: ids `[runs, P + length]`, features `[.., H]`."""
    ids = torch.tensor([PROMPT] * runs)
    for _ in range(length):
        logits = target.lm_head(dense_forward(target, ids)[:, -1])
        ids = torch.cat([ids, torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)], dim=1)
    return ids, dense_forward(target, ids)


def _lstsq(x: Tensor, y: Tensor) -> Tensor:
    """W with x @ W.T ~ y (float64 least squares, a little ridge for stability)."""
    x, y = x.double(), y.double()
    gram = x.T @ x + 1e-3 * torch.eye(x.shape[1], dtype=torch.float64)
    return torch.linalg.solve(gram, x.T @ y).T.float()


@torch.no_grad()
def _fitted_eagle(target, ids: Tensor, features: Tensor):
    predictor = init_predictor(target, 1, seed=0).eval().requires_grad_(False)
    start = len(PROMPT) - 1
    emb = target.embed_tokens(ids[:, start + 1:])  # x_{t+1}
    x = torch.cat([emb, features[:, start:-1]], dim=-1).reshape(-1, 2 * emb.shape[-1])
    y = features[:, start + 1:].reshape(-1, emb.shape[-1])  # f_{t+1}
    x1 = torch.cat([x, torch.ones(x.shape[0], 1)], dim=-1)
    w = _lstsq(x1, y)
    noise = torch.randn(w[:, :-1].shape, generator=torch.Generator().manual_seed(12)) * EAGLE_NOISE
    predictor.fc.weight.copy_(w[:, :-1] + noise)  # fitted, then blurred: a perfect q would test little
    predictor.fc.bias.copy_(w[:, -1])
    predictor.o_proj.weight.mul_(0.1)  # the layer still attends over its own paged cache, but lightly
    predictor.mlp.down_proj.weight.mul_(0.1)
    return predictor


@torch.no_grad()
def _fitted_medusa(target, ids: Tensor, features: Tensor) -> MedusaHeads:
    c = target.config
    start = len(PROMPT) - 1
    projections = []
    for d in range(DEPTH):
        x = features[:, start: ids.shape[1] - d - 2].reshape(-1, c.hidden_size)
        y = torch.nn.functional.one_hot(ids[:, start + d + 2:], VOCAB).reshape(-1, VOCAB).float()
        projections.append(_lstsq(x, y) * 10.0)  # scaled so log-softmax scores are not all alike
    return MedusaHeads(DEPTH, 1, c.hidden_size, VOCAB, projections=torch.stack(projections)).requires_grad_(False)


# ------------------------------------------------------------------------------------------ exact reference
def reference_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """Rows of logits -> the distribution a request samples from, in float64, written out afresh here.

    Temperature, then top-k on the logits, then softmax, then top-p (the smallest most-likely set whose mass
    reaches top_p), renormalised. Fails if a top-k or top-p cut falls so near a tie or the threshold that
    float32 and float64 could disagree about it (the reference would then be ambiguous)."""
    z = logits.double() / params.temperature
    if params.top_k and params.top_k < z.shape[-1]:
        ranked = z.sort(dim=-1, descending=True).values
        gap = (ranked[:, params.top_k - 1] - ranked[:, params.top_k]).min()
        assert gap > 1e-4, f"top-k cut within {gap:.1e} of a tie: pick another case"
        z = torch.where(z >= ranked[:, params.top_k - 1: params.top_k], z, torch.full_like(z, -math.inf))
    probs = torch.exp(z - z.max(-1, keepdim=True).values)
    probs = probs / probs.sum(-1, keepdim=True)
    if params.top_p < 1.0:
        ranked, order = probs.sort(dim=-1, descending=True)
        before = ranked.cumsum(-1) - ranked
        margin = (before - params.top_p).abs().min()
        assert margin > 1e-4, f"top-p cut within {margin:.1e} of the threshold: pick another case"
        kept = torch.where(before < params.top_p, ranked, torch.zeros_like(ranked))
        probs = torch.zeros_like(probs).scatter(-1, order, kept)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


@torch.inference_mode()
def exact_joint(target, params: SamplingParams, horizon: int = HORIZON) -> Tensor:
    """P(t1, ..., t_horizon) as a float64 tensor `[V] * horizon`, from a dense forward over every context."""
    joint = torch.ones((), dtype=torch.float64)
    for k in range(horizon):
        contexts = torch.tensor([PROMPT + list(c) for c in itertools.product(range(VOCAB), repeat=k)])
        logits = target.lm_head(dense_forward(target, contexts)[:, -1])
        step = reference_probs(logits, params).view(*([VOCAB] * k), VOCAB)
        joint = joint.unsqueeze(-1) * step
    return joint


# ------------------------------------------------------------------------------------------------ sampling
@dataclass
class Sampled:
    tokens: Tensor  # [runs, horizon] int64
    accept_depth1: float  # fraction of verify steps that accept a drafted token at depth 1
    accept_full: float  # fraction of verify steps that accept a whole root-to-depth-DEPTH path
    verify_calls: int = 0  # how often the verification rule under test ran (planted rules count their calls)


def make_drafter(kind: str, models: Models, config: EngineConfig):
    if kind == "draft":
        return DraftModelDrafter(models.draft, config, k=DEPTH)
    if kind == "eagle":
        return EagleDrafter(models.eagle, models.target, config)
    if kind == "medusa":
        return MedusaDrafter(models.medusa)
    if kind == "ngram":
        return NgramDrafter(n=2, k=DEPTH, branches=2)
    raise ValueError(kind)


class RandomDepthPlanner(SpeculationPlanner):
    """Cuts every sequence's tree to a random depth each step, 0 (a plain step) included.

    The real planner picks depths from measured costs, and pins seeded requests to the full tree; whatever it
    picks, the output must keep the target's distribution, so this one picks anything, reproducibly."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.rng = random.Random(seed)

    def plan(self, seqs, spec: TreeSpec, prefill_tokens: int = 0, closed: bool = False,
             waiting_left: int = 0) -> list[int]:
        return [self.rng.randint(0, spec.depth) for _ in seqs]


def sample(models: Models, case: Case, seed: int = 0) -> Sampled:
    """`case.runs` requests through the real engine (drafter, one target pass, verifier, KV commit)."""
    runs = case.runs
    config = EngineConfig(max_num_seqs=runs, max_num_batched_tokens=runs * (case.tree.max_nodes + len(PROMPT)),
                          kv_cache_tokens=runs * 4 * BLOCK_SIZE, block_size=BLOCK_SIZE,
                          max_tree_nodes=case.tree.max_nodes, adaptive_speculation=case.random_depths)
    planner = RandomDepthPlanner(seed) if case.random_depths else None
    engine = Engine(models.target, NoTokenizer(), config, make_drafter(case.drafter, models, config), case.tree,
                    planner=planner)
    p = case.params
    base = 1_000_003 * seed
    seqs = [engine.add_request(PROMPT, SamplingParams(
        max_new_tokens=HORIZON, temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, ignore_eos=True,
        seed=base + i)) for i in range(runs)]
    run_all(engine)
    assert engine.runner.cache.num_free_blocks == engine.runner.cache.pool.num_blocks, "blocks leaked"
    tokens = torch.tensor([s.output_ids for s in seqs], dtype=torch.int64)
    assert tokens.shape == (runs, HORIZON)
    proposed = sum(s.metrics.proposed_by_depth[0] if s.metrics.proposed_by_depth else 0 for s in seqs)
    depth1 = sum(s.metrics.accepted_by_depth[0] if s.metrics.accepted_by_depth else 0 for s in seqs)
    full = sum(s.metrics.accepted_by_depth[DEPTH - 1] if len(s.metrics.accepted_by_depth) >= DEPTH else 0
               for s in seqs)
    return Sampled(tokens, depth1 / max(proposed, 1), full / max(proposed, 1))


# --------------------------------------------------------------------------------------- goodness of fit
@dataclass
class Fit:
    p_value: float  # combined (Bonferroni over the views); 0 if a sample fell in an impossible cell
    impossible: int  # samples whose exact probability is 0
    views: dict[str, float] = field(default_factory=dict)  # each view's own chi-square p-value

    def describe(self) -> str:
        views = ", ".join(f"{k} {v:.1e}" for k, v in self.views.items())
        return f"p={self.p_value:.2e} (impossible samples: {self.impossible}; {views})"


def chi_square(observed: Tensor, expected: Tensor, min_expected: float = MIN_EXPECTED) -> float:
    """Pearson's test over cells of positive expectation; cells expected below `min_expected` are pooled into
    one bin, which takes in the next smallest cells until it expects at least `min_expected` itself."""
    order = expected.argsort()
    exp, obs = expected[order], observed[order].double()
    small = int((exp < min_expected).sum())
    if small:
        cum = exp.cumsum(0)
        small = max(small, int((cum < min_expected).sum()) + 1)
        small = min(small, exp.numel())
        exp = torch.cat([exp[:small].sum().view(1), exp[small:]])
        obs = torch.cat([obs[:small].sum().view(1), obs[small:]])
    dof = exp.numel() - 1
    if dof < 1:
        return 1.0
    stat = ((obs - exp) ** 2 / exp).sum()
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat / 2.0))


def views(horizon: int = HORIZON) -> dict[str, tuple[int, ...]]:
    """Which token positions each view keeps: the whole joint, and each adjacent pair."""
    out = {"joint": tuple(range(horizon))}
    out.update({f"t{k + 1}t{k + 2}": (k, k + 1) for k in range(horizon - 1)})
    return out


def goodness_of_fit(tokens: Tensor, joint: Tensor) -> Fit:
    runs, horizon = tokens.shape
    index = torch.zeros(runs, dtype=torch.int64)
    for k in range(horizon):
        index = index * VOCAB + tokens[:, k]
    counts = torch.bincount(index, minlength=VOCAB**horizon).double().view(joint.shape)
    impossible = int(counts[joint == 0].sum())
    result = Fit(0.0 if impossible else 1.0, impossible)
    all_dims = set(range(horizon))
    for name, keep in views(horizon).items():
        drop = tuple(sorted(all_dims - set(keep)))
        obs = counts.sum(drop) if drop else counts
        exp = joint.sum(drop) if drop else joint
        positive = exp.flatten() > 0
        result.views[name] = chi_square(obs.flatten()[positive], exp.flatten()[positive] * runs)
    if not impossible:
        result.p_value = min(1.0, len(result.views) * min(result.views.values()))
    return result


# -------------------------------------------------------------------------------------- planted rules
def patch_verifier(monkeypatch, rule: Callable) -> None:
    """Make every specdec module that imported `verify_stochastic` use `rule` instead (wherever the engine's
    verification lives)."""
    real = rules.verify_stochastic
    patched = 0
    for name, module in list(sys.modules.items()):
        if name.startswith("specdec") and module is not None and getattr(module, "verify_stochastic", None) is real:
            if module is not rules:
                monkeypatch.setattr(module, "verify_stochastic", rule)
                patched += 1
    assert patched, "no specdec module calls verify_stochastic any more: update the planted-rule test"


def planted_rule(bug: str | None, temperature: float = 1.0) -> Callable:
    """Recursive rejection sampling written out again with one planted bug (`bug=None`: none, which must
    match `rules.verify_stochastic` draw for draw; `test_planted_rules_differ_only_by_their_bug` checks it).

    Bugs: "q/p" accepts with min(1, q/p); "parent row" samples the bonus after a fully accepted path from the
    last node's parent's row; "bonus from p" samples the bonus after a rejection from p, not the residual;
    "untempered q" reads each proposal row as if drawn at temperature 1 (`q ** T`, renormalised: the
    drafter's logits softmaxed without the request's temperature); "unnormalised residual" tests later
    siblings against max(p - q, 0) without dividing by its mass.
    """

    def verify(tree, probs: Tensor, generator) -> rules.VerifyResult:
        verify.calls += 1
        tokens = tree.tokens.tolist()
        node, path = 0, [0]
        while True:
            p = probs[node]
            accepted = None
            for child in tree.children[node]:
                token = tokens[child]
                if tree.draft_probs is None:
                    q = torch.zeros_like(p)
                    q[token] = 1.0
                else:
                    q = tree.draft_probs[child].to(p.dtype)
                    if bug == "untempered q":
                        q = q ** temperature
                        q = q / q.sum()
                if bug == "q/p":
                    ratio = float(q[token]) / max(float(p[token]), 1e-30)
                else:
                    ratio = float(p[token]) / max(float(q[token]), 1e-30)
                if rules.uniform(generator, p.device) < min(1.0, ratio):
                    accepted = child
                    break
                residual = torch.clamp(p - q, min=0.0)
                total = float(residual.sum())
                if total <= 0.0:
                    break
                p = residual if bug == "unnormalised residual" else residual / total
            if accepted is None:
                bonus = rules.sample(probs[node] if bug == "bonus from p" else p, generator)
                return rules.VerifyResult(path, [tokens[i] for i in path[1:]] + [bonus], bonus)
            node = accepted
            path.append(node)
            if not tree.children[node]:
                row = probs[tree.parent_list[node]] if bug == "parent row" else probs[node]
                bonus = rules.sample(row, generator)
                return rules.VerifyResult(path, [tokens[i] for i in path[1:]] + [bonus], bonus)

    verify.calls = 0
    return verify


# --------------------------------------------------------------------------------------------------- cases
TREE = dynamic(depth=DEPTH, topk=2, budget=6)
CHAIN = chain(DEPTH)
T1 = SamplingParams(temperature=1.0)
T07 = SamplingParams(temperature=0.7)
T05 = SamplingParams(temperature=0.5)
TOP_K = SamplingParams(temperature=1.0, top_k=4)
TOP_P = SamplingParams(temperature=0.8, top_p=0.85)

# Chains of the draft model and EAGLE sample their tokens and pass q on; their trees, Medusa and n-gram
# propose deterministic tokens (one-hot q). Every sampling control meets both kinds of proposal.
CASES: dict[str, Case] = {
    "draft chain T=1": Case("draft", CHAIN, T1),
    "draft chain top-k": Case("draft", CHAIN, TOP_K),
    "draft chain top-p": Case("draft", CHAIN, TOP_P),
    "draft chain T=0.5": Case("draft", CHAIN, T05),
    "draft tree T=0.7": Case("draft", TREE, T07),
    "eagle chain T=0.7": Case("eagle", CHAIN, T07),
    "eagle tree top-p": Case("eagle", TREE, TOP_P),
    "medusa chain T=0.7": Case("medusa", CHAIN, T07),
    "medusa tree top-k": Case("medusa", TREE, TOP_K),
    "ngram chain top-p": Case("ngram", CHAIN, TOP_P),
    "ngram tree T=1": Case("ngram", TREE, T1),
    "draft chain T=1, random depths": Case("draft", CHAIN, T1, random_depths=True),
    "eagle tree T=1, random depths": Case("eagle", TREE, T1, random_depths=True),
}

# Each planted rule, and the case it must fail on (one where its bug changes the distribution: the
# unnormalised residual only matters between siblings, untempered q only below T=1 with a sampled q, and
# clearly only well below: at T=0.7 its p-value ranged from 1e-10 to 6e-3 over five seeds, at T=0.5 it is tiny).
PLANTED_CASES: dict[str, tuple[str, str]] = {
    "accept with min(1, q/p)": ("q/p", "draft chain T=1"),
    "bonus from the parent's row after a full path": ("parent row", "draft chain T=1"),
    "bonus from p instead of the residual": ("bonus from p", "eagle chain T=0.7"),
    "untempered q": ("untempered q", "draft chain T=0.5"),
    "residual not renormalised": ("unnormalised residual", "medusa tree top-k"),
}
