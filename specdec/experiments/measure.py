"""Run acceptance experiments: one configuration (`measure_acceptance`) or a grid of them (`sweep`).

Measurement rides on the engine's `step_observers` hook: every verify step hands us its tree and the accepted
path, so the numbers are exactly what the engine did, with no second implementation of drafting or
verification. Nothing here changes how tokens are generated.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Iterable

import torch

from specdec.config import SamplingParams
from specdec.drafters.oracle import prepare_oracle
from specdec.errors import ConfigError
from specdec.experiments.report import AcceptanceReport, ExperimentSettings
from specdec.experiments.stats import AcceptanceStats
from specdec.spec_strings import parse_spec
from specdec.engine.sequence import Sequence
from specdec.tree.token_tree import TokenTree
from specdec.tree.spec import TreeSpec
from specdec.verifier.result import VerifyResult


def measure_acceptance(
    llm: Any,
    prompts: Any,
    sampling: SamplingParams | None = None,
    drafter: str | None = None,
    tree: str | None = None,
    seed: int = 0,
    chat: bool = True,
    adaptive: bool = False,
) -> AcceptanceReport:
    """Generate for `prompts` with `drafter` and `tree` and report how drafts were accepted.

    `llm` is a `specdec.LLM`; `drafter`/`tree` switch it with `llm.use` (the model stays loaded; None keeps the
    current drafter, and its default tree when `tree` is None too). Prompts are text, token ids, chat
    messages, or records `{"prompt": ..., "category": ...}` such as `specdec.data.bench_prompts()` returns
    (categories give a per-category breakdown). Prompt i samples with seed `seed + i` unless `sampling`
    fixes a seed, so sampled runs repeat exactly. The oracle drafter gets its greedy references
    (`prepare_oracle`) before the timed run.

    The engine's adaptive speculation (which cuts trees when speculation does not pay) is switched off for
    the run unless `adaptive=True`: acceptance by depth and rank is only meaningful for the full tree.
    """
    if drafter is not None or tree is not None:
        llm.use(drafter if drafter is not None else llm.drafter_spec, tree)
    texts, categories = split_prompts(prompts)
    base = SamplingParams() if sampling is None else sampling
    first_seed = base.seed if base.seed is not None else seed
    params = [replace(base, seed=first_seed + i) for i in range(len(texts))]
    prepare_oracle(llm, texts, base.max_new_tokens, chat)  # untimed reference continuations (oracle only)

    per_request: dict[int, AcceptanceStats] = {}

    def observe(seq: Sequence, tree: TokenTree, result: VerifyResult) -> None:
        stats = per_request.get(seq.seq_id)
        if stats is None:
            stats = per_request[seq.seq_id] = AcceptanceStats()
        stats.observe(tree, result)

    engine = llm.engine
    planner = getattr(engine, "planner", None)
    engine.step_observers.append(observe)
    if not adaptive:
        engine.planner = None
    torch.manual_seed(first_seed)  # for drafters that draw from torch's global generator
    start = time.perf_counter()
    try:
        outputs = llm.generate(texts, params, chat=chat)
    finally:
        engine.step_observers.remove(observe)
        if planner is not None:
            engine.planner = planner
    wall = time.perf_counter() - start

    overall = AcceptanceStats()
    by_category: dict[str, AcceptanceStats] = {}
    for out, category in zip(outputs, categories):
        stats = per_request.get(out.request_id, AcceptanceStats())
        stats.add_request(out.metrics.num_generated, out.metrics.draft_time_s, out.metrics.verify_time_s)
        overall = overall.merge(stats)
        if category is not None:
            by_category[category] = by_category.get(category, AcceptanceStats()).merge(stats)
    settings = ExperimentSettings(
        target=str(llm.target), drafter=llm.drafter_spec, tree=tree or describe_tree(llm.tree_spec),
        temperature=float(base.temperature), top_k=base.top_k, top_p=base.top_p, seed=first_seed,
        num_prompts=len(texts), max_new_tokens=base.max_new_tokens, quantize=llm.quantize,
        device=str(llm.model.device), adaptive=adaptive and planner is not None,
    )
    return AcceptanceReport(settings, overall, by_category, wall)


def sweep(
    llm: Any,
    prompts: Any,
    drafters: Iterable[str],
    trees: Iterable[str | None] = (None,),
    temperatures: Iterable[float] = (0.0,),
    sampling: SamplingParams | None = None,
    seed: int = 0,
    chat: bool = True,
    adaptive: bool = False,
    on_report: Callable[[AcceptanceReport], None] | None = None,
) -> list[AcceptanceReport]:
    """Every drafter x tree x temperature, in that nesting order, on the same prompts and seeds.

    `trees` entries of None mean the drafter's default tree. Plain decode (`none`) has no tree, so it is
    measured once per temperature, with the tree left out. `sampling` supplies everything but the
    temperature (max_new_tokens, top_k, ...). `on_report` sees each report as soon as it is measured.
    Save the result with `specdec.experiments.save_reports`.
    """
    base = SamplingParams() if sampling is None else sampling
    drafters, trees, temperatures = list(drafters), list(trees), list(temperatures)
    if not drafters or not trees or not temperatures:
        raise ConfigError("a sweep needs at least one drafter, one tree (None = default) and one temperature")
    reports = []
    for drafter in drafters:
        drafter_trees = [None] if parse_spec(drafter, what="drafter")[0] == "none" else trees
        for tree in drafter_trees:
            for temperature in temperatures:
                report = measure_acceptance(llm, prompts, replace(base, temperature=temperature), drafter=drafter,
                                            tree=tree, seed=seed, chat=chat, adaptive=adaptive)
                reports.append(report)
                if on_report is not None:
                    on_report(report)
    return reports


def split_prompts(prompts: Any) -> tuple[list[Any], list[str | None]]:
    """(prompts for `LLM.generate`, category of each) from text, ids, chat messages or prompt records."""
    if isinstance(prompts, (str, dict)):
        prompts = [prompts]
    elif isinstance(prompts, list) and prompts and all(isinstance(t, int) for t in prompts):
        prompts = [prompts]  # one prompt of token ids
    elif isinstance(prompts, list) and prompts and all(isinstance(m, dict) and "role" in m for m in prompts):
        prompts = [prompts]  # one chat conversation
    texts, categories = [], []
    for p in prompts:
        if isinstance(p, dict):
            if "prompt" not in p:
                raise ConfigError(f"a prompt record needs a \"prompt\" field, got keys {sorted(p)}")
            texts.append(p["prompt"])
            categories.append(p.get("category"))
        else:
            texts.append(p)
            categories.append(None)
    if not texts:
        raise ConfigError("no prompts given")
    return texts, categories


def describe_tree(spec: TreeSpec) -> str:
    """A spec string for a tree shape (see `TreeSpec.describe`)."""
    return spec.describe()
