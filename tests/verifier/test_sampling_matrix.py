"""Every sampling control under every drafter: the composition matrix.

Drafters: none, ngram, oracle, draft, medusa, eagle, recycle, suffix, hybrid (suffix+recycle), on the tiny
target of `tests/verifier/lossless.py` (vocabulary 8, so penalties change the argmax often and every tree
path repeats tokens). Controls: greedy, each penalty, min_p, logit_bias, logprobs, stop token ids with
min_new_tokens, stop strings, all at once, and n=2.

- Greedy cells: each drafter's output equals plain decoding's (the `none` drafter) token for token, and plain
  decoding equals an independent float64 reference (`sampling_reference.py`). Logprobs equal plain decoding's
  within 1e-4 (fp32).
- Sampled cells: the logprob of every sampled token (T=0.7, penalties, min_p, logit_bias) is the reference's
  for its own context within 1e-4, for every drafter; and goodness of fit against the exact processed joint of
  5 tokens for the penalties, min_p and logit_bias on four drafter/tree kinds (sampled q, one-hot q).
- Power: with the planted wrong rule "penalties from the committed tokens only, without the node's path", the
  greedy cells diverge and a goodness-of-fit cell fails with p < 1e-6.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch

from specdec.config import EngineConfig, SamplingParams
from specdec.drafters.base import DrafterContext
from specdec.drafters.registry import build_drafter
from specdec.engine.engine import Engine
from specdec.models.loader import LoadedModel
from specdec.sampling import history as history_module
from specdec.sampling import processors
from specdec.sampling.seeds import per_sample
from specdec.tree import sampled
from specdec.tree.spec import TreeSpec
from tests.helpers import NoTokenizer, run_all
from tests.verifier import lossless as L
from tests.verifier import sampling_reference as R

pytestmark = pytest.mark.timeout(300)

DRAFTERS = ["none", "ngram", "oracle", "draft", "medusa", "eagle", "recycle", "suffix", "hybrid"]
SPECS = {"none": "none", "ngram": "ngram:n=2,k=3,branches=2", "oracle": "oracle:alpha=0.7,k=3", "recycle": "recycle",
         "suffix": "suffix:min_prob=0.0", "hybrid": "hybrid:suffix:min_prob=0.0+recycle"}
PROMPTS = [L.PROMPT, [5, 2, 6, 0, 1, 4, 4, 2]]
NEW = 20
STOP = 7  # the tiny target's first greedy token after L.PROMPT: min_new_tokens must hold it back
GREEDY = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
CONTROLS: dict[str, SamplingParams] = {
    "greedy": GREEDY,
    "repetition": replace(GREEDY, repetition_penalty=1.6),
    "frequency": replace(GREEDY, frequency_penalty=0.6),
    "presence": replace(GREEDY, presence_penalty=1.0),
    "min_p": replace(GREEDY, min_p=0.3),
    "logit_bias": replace(GREEDY, logit_bias={2: -1.0, 6: 0.8}),
    "logprobs": replace(GREEDY, logprobs=3, frequency_penalty=0.4),
    "stop token ids": replace(GREEDY, stop_token_ids=(STOP,), min_new_tokens=3),
    "stop strings": replace(GREEDY, stop=("1 5",), presence_penalty=0.5),  # NoTokenizer joins ids with spaces
    "everything": replace(GREEDY, repetition_penalty=1.3, frequency_penalty=0.3, presence_penalty=0.3,
                          logit_bias={3: 0.5}, logprobs=2, stop_token_ids=(STOP,), min_new_tokens=2),
}
N2 = replace(GREEDY, n=2, frequency_penalty=0.5)
SAMPLED = SamplingParams(max_new_tokens=12, temperature=0.7, top_k=6, min_p=0.05, frequency_penalty=0.5,
                         presence_penalty=0.3, repetition_penalty=1.2, logit_bias={1: -0.5}, logprobs=3,
                         ignore_eos=True)


@pytest.fixture(scope="module")
def models() -> L.Models:
    return L.build_models()


def make_engine(kind: str, models: L.Models, tree: TreeSpec | None = None, runs: int = 64) -> Engine:
    tree = tree or L.TREE
    config = EngineConfig(max_num_seqs=runs, max_num_batched_tokens=runs * (tree.max_nodes + len(L.PROMPT)),
                          kv_cache_tokens=runs * 8 * L.BLOCK_SIZE, block_size=L.BLOCK_SIZE,
                          max_tree_nodes=tree.max_nodes, adaptive_speculation=False)
    if kind in ("draft", "eagle", "medusa"):
        drafter = L.make_drafter(kind, models, config)
    else:
        ctx = DrafterContext(LoadedModel(models.target, NoTokenizer(), "tiny"), config, torch.device("cpu"),
                             torch.float32, None)
        drafter = build_drafter(SPECS[kind], ctx)
    return Engine(models.target, NoTokenizer(), config, drafter, drafter.default_tree() if kind == "none" else tree)


@dataclass
class Run:
    outputs: dict[tuple[str, int], list[int]]  # (control, prompt index) -> tokens
    logprobs: dict[tuple[str, int], list]  # the same -> TokenLogprob list
    samples: list[list[int]]  # n=2 cell: per prompt, both samples' tokens
    accepted: int


def run_greedy_matrix(kind: str, models: L.Models) -> Run:
    engine = make_engine(kind, models)
    seqs, keys = [], []
    for name, params in CONTROLS.items():
        for i, prompt in enumerate(PROMPTS):
            seqs.append(engine.add_request(prompt, params))
            keys.append((name, i))
    pairs = []
    for prompt in PROMPTS:
        first, second = per_sample(N2)
        lead = engine.add_request(prompt, first)
        pairs.append((lead, engine.add_request(prompt, second, share_prefix_with=lead)))
    run_all(engine)
    cache = engine.runner.cache
    assert cache.num_free_blocks == cache.pool.num_blocks, "blocks leaked"
    return Run({k: s.output_ids for k, s in zip(keys, seqs)}, {k: s.logprobs for k, s in zip(keys, seqs)},
               [[a.output_ids, b.output_ids] for a, b in pairs], sum(s.metrics.accepted_drafts for s in seqs))


@pytest.fixture(scope="module")
def plain(models) -> Run:
    return run_greedy_matrix("none", models)


def test_plain_decoding_with_every_control_equals_the_reference(models, plain):
    for (name, i), tokens in plain.outputs.items():
        params = CONTROLS[name]
        expected = R.greedy_reference(models.target, PROMPTS[i], params)
        if params.stop:
            text = " ".join(map(str, tokens))
            assert text.endswith(params.stop[0]) or len(tokens) == NEW, (name, i)
            expected = expected[: len(tokens)]
        assert tokens == expected, (name, i)
        if params.logprobs is not None:
            for j, lp in enumerate(plain.logprobs[(name, i)]):
                ctx = tokens[:j]
                z = R.reference_logits(R.target_rows(models.target, [PROMPTS[i] + ctx])[0], params, PROMPTS[i], ctx)
                ref = R.reference_logprobs(z, params)
                assert abs(lp.logprob - float(ref[lp.token_id])) < 1e-4
                assert [t for t, _ in lp.top] == ref.topk(params.logprobs).indices.tolist()
    assert plain.outputs[("greedy", 0)][0] == STOP
    assert STOP not in plain.outputs[("stop token ids", 0)][:3] and plain.outputs[("stop token ids", 0)][-1] == STOP
    for name in ("repetition", "frequency", "presence", "logit_bias"):
        assert plain.outputs[(name, 0)] != plain.outputs[("greedy", 0)], f"{name} changed nothing: the cell tests little"


@pytest.mark.parametrize("kind", DRAFTERS[1:])
def test_speculative_greedy_with_every_control_equals_plain_decoding(models, plain, kind):
    spec = run_greedy_matrix(kind, models)
    assert spec.accepted > 0, f"{kind}: no drafted token was accepted; the cell would prove nothing"
    for key, tokens in plain.outputs.items():
        assert spec.outputs[key] == tokens, (kind, key)
        for a, b in zip(spec.logprobs[key], plain.logprobs[key]):
            assert a.token_id == b.token_id and abs(a.logprob - b.logprob) < 1e-4, (kind, key)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
            assert all(abs(x - y) < 1e-4 for (_, x), (_, y) in zip(a.top, b.top))
    assert spec.samples == plain.samples
    for first, second in spec.samples:
        assert first == second  # greedy: both samples of n=2 are the one greedy output


@pytest.mark.parametrize("kind", DRAFTERS)
def test_sampled_logprobs_are_the_processed_distributions_for_every_drafter(models, kind):
    engine = make_engine(kind, models)
    seqs = []
    for i, prompt in enumerate(PROMPTS):
        for p in per_sample(replace(SAMPLED, seed=100 + i, n=3)):
            seqs.append((i, engine.add_request(prompt, p)))
    run_all(engine)
    streams = set()
    for i, seq in seqs:
        out, prompt = seq.output_ids, PROMPTS[i]
        streams.add(tuple(out))
        assert [lp.token_id for lp in seq.logprobs] == out
        for j, lp in enumerate(seq.logprobs):
            row = R.target_rows(models.target, [prompt + out[:j]])[0]
            ref = R.reference_logprobs(R.reference_logits(row, SAMPLED, prompt, out[:j]), SAMPLED)
            assert ref[lp.token_id] > -float("inf"), f"{kind}: sampled a token of probability 0"
            assert abs(lp.logprob - float(ref[lp.token_id])) < 1e-4, (kind, i, j)
            assert dict(lp.top).keys() <= set(torch.nonzero(ref > -float("inf")).flatten().tolist())
    assert len(streams) == len(seqs), "two of the n samples drew the same tokens: their seed streams are shared"


# ------------------------------------------------------------------------------------------ goodness of fit
@dataclass(frozen=True)
class FitCase:
    drafter: str
    tree: TreeSpec
    params: SamplingParams
    sampled_trees: bool = False  # model drafters: children drawn from q without replacement (specdec.tree.sampled)
    draft_temperature: float = 1.0  # model drafters: draws at this multiple of the request's temperature
    runs: int = 1200  # the planted rule fails at p < 1e-14 with this many (two seeds checked)


GOF: dict[str, FitCase] = {
    "ngram tree: frequency + presence": FitCase("ngram", L.TREE, SamplingParams(
        temperature=1.0, frequency_penalty=0.8, presence_penalty=0.6)),
    "draft chain: repetition + logit_bias": FitCase("draft", L.CHAIN, SamplingParams(
        temperature=0.8, repetition_penalty=1.5, logit_bias={2: 0.7, 5: -0.8})),
    "eagle tree: min_p + presence": FitCase("eagle", L.TREE, SamplingParams(
        temperature=1.0, min_p=0.12, presence_penalty=0.9)),
    "medusa tree: everything": FitCase("medusa", L.TREE, SamplingParams(
        temperature=0.9, top_p=0.95, min_p=0.05, repetition_penalty=1.2, frequency_penalty=0.4,
        logit_bias={3: 0.5})),
    "draft sampled tree: T=0.7 + frequency": FitCase("draft", L.TREE, SamplingParams(
        temperature=0.7, frequency_penalty=0.5), sampled_trees=True),
    "eagle sampled tree: top-p + presence": FitCase("eagle", L.TREE, SamplingParams(
        temperature=0.8, top_p=0.85, presence_penalty=0.6), sampled_trees=True),
    "eagle sampled tree, sharpened draws: T=1 + repetition": FitCase("eagle", L.TREE, SamplingParams(
        temperature=1.0, repetition_penalty=1.3), sampled_trees=True, draft_temperature=0.5),
}


def sample_case(models: L.Models, case: FitCase, seed: int = 0) -> torch.Tensor:
    engine = make_engine(case.drafter, models, case.tree, runs=case.runs)
    if case.sampled_trees:
        engine.drafter.set_sampling(("sampled", case.draft_temperature))
    base = 1_000_003 * seed
    seqs = [engine.add_request(L.PROMPT, replace(case.params, max_new_tokens=L.HORIZON, ignore_eos=True,
                                                 seed=base + i)) for i in range(case.runs)]
    run_all(engine)
    assert sum(s.metrics.accepted_drafts for s in seqs) > case.runs // 2, "drafts were hardly ever accepted"
    return torch.tensor([s.output_ids for s in seqs], dtype=torch.int64)


@pytest.mark.parametrize("name", list(GOF))
def test_sampled_output_follows_the_exact_processed_distribution(models, name):
    case = GOF[name]
    fit = L.goodness_of_fit(sample_case(models, case), R.exact_joint(models.target, case.params))
    assert fit.impossible == 0, f"{name}: {fit.impossible} samples the target gives probability 0"
    assert fit.p_value > 1e-4, f"{name}: samples do not follow the processed distribution: {fit.describe()}"


def committed_only(prompt_ids, output_ids, tree, vocab, device):
    """The planted wrong rule: every row of a tree gets the committed tokens' history, not its path's."""
    one = history_module.row_history(prompt_ids, output_ids, None, vocab, device)
    n = 1 if tree is None else len(tree)
    return history_module.RowHistory(one.ids, one.output_counts.repeat(n, 1), one.seen.repeat(n, 1),
                                     one.generated.repeat(n))


def test_planted_rule_without_the_nodes_path_is_caught(models, plain, monkeypatch):
    monkeypatch.setattr(processors, "row_history", committed_only)
    spec = run_greedy_matrix("ngram", models)
    assert any(spec.outputs[k] != v for k, v in plain.outputs.items()), "greedy cells missed the planted rule"
    case = GOF["ngram tree: frequency + presence"]
    fit = L.goodness_of_fit(sample_case(models, case), R.exact_joint(models.target, case.params))
    assert fit.p_value < 1e-6, f"the planted rule passed: {fit.describe()}"


def test_planted_sampled_tree_rule_with_unconditioned_sibling_rows_is_caught(models, monkeypatch):
    """Siblings drawn without replacement but each passed on as the whole q (not q without the earlier
    siblings): the verifier then tests later siblings against the wrong proposal, which must be seen."""
    real = sampled.SampledGrowth.expand

    def expand_tracking_rows(self, q_rows, generator):
        before = len(self.tokens)
        parents_before = list(self.frontier)
        real(self, q_rows, generator)
        row_of = {node: row for row, node in enumerate(parents_before)}
        for node in range(before, len(self.tokens)):
            self.rows[node] = q_rows[row_of[self.parents[node]]].float()

    monkeypatch.setattr(sampled.SampledGrowth, "expand", expand_tracking_rows)
    # a sharp q (T=0.5) makes the wrong row matter most: p < 1e-16 over two seeds, and the real rule passes here
    case = FitCase("draft", L.TREE, SamplingParams(temperature=0.5), sampled_trees=True)
    fit = L.goodness_of_fit(sample_case(models, case), R.exact_joint(models.target, case.params))
    assert fit.p_value < 1e-6, f"the planted rule passed: {fit.describe()}"
