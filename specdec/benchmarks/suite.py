"""The bench suite behind `specdec bench`: our plain decode and every drafter against transformers, per category.

    specdec bench --quick                                        # CI: 6 prompts, 16 tokens, none + ngram, 2 peers
    specdec bench --quantize int8 --prompts-per-category 2 --max-new-tokens 64
    specdec bench --device cuda --target dummy:llama-3-8b --drafter oracle:alpha=0.8   # GPU systems run
    python bench/suite.py --quick                                # the same command without the console script

Categories mirror Spec-Bench (multi-turn conversation, translation, summarization, QA, math reasoning, RAG),
drawn from our own prompts (`specdec/data/prompts`, test split by default). Greedy, batch 1. For every prompt, every
method runs back to back (interleaved, with the starting method rotating from prompt to prompt), so drift on
a shared machine hits them alike. A conversation's second turn is sent after the method's own reply to the
first, and both turns count.

Speed is end-to-end: generated tokens / wall time of the generate calls, prefill and drafting included, for us
and for transformers alike. Speedups are ratios of those pooled tok/s (all of a category's tokens over all of
its time) from the same interleaved runs. tau is tokens per target forward (see bench/peers.py for how the
peers' are counted). "Same output" is the share of prompts whose greedy tokens equal our plain decode's:
lossless methods should score 100%, up to float near-ties (and an int8 target differs from fp32 transformers).

Results: `<out>/suite.md` (Spec-Bench leaderboard tables), `suite.json` (settings, environment, every row),
`speedup.png` and `acceptance.png` (acceptance by depth as RequestMetrics defines it, pooled over all runs
from per-step counts taken through the engine's step observers). Our engine runs with its default
EngineConfig, adaptive speculation included: the suite measures what a user gets.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specdec.benchmarks.peers import PEER_NAMES, build_peers
from specdec.benchmarks.report import write_outputs
from specdec.benchmarks.runs import DepthCounter, Run, parse_methods
from specdec import LLM, SamplingParams
from specdec.config import EngineConfig
from specdec.data import CATEGORIES, bench_prompts
from specdec.errors import ConfigError, MissingDependencyError

SPEC_BENCH_CATEGORIES = ("conversation", "translation", "summarization", "qa", "math", "rag")
SYNTHETIC_DRAFTERS = {"oracle"}  # controlled-acceptance drafters for systems runs: only when asked for by name
# Relative to the working directory, never inside the package or over committed results (`--out` to choose).
DEFAULT_OUT = Path("runs") / "bench-suite"
QUICK = {"prompts_per_category": 1, "max_new_tokens": 16, "methods": "ngram", "peers": ("generate", "prompt-lookup")}
FULL = {"prompts_per_category": 2, "max_new_tokens": 64, "methods": None, "peers": PEER_NAMES}


@dataclass(frozen=True)
class SuiteOptions:
    target: str = "smollm2-135m"
    device: str = "cpu"
    dtype: str = "float32"
    quantize: str | None = None  # our engine only; transformers stays fp32
    kv_cache_tokens: int | None = None  # per method's engine; None = EngineConfig's default (batch 1 needs ~1k)
    kv_cache_dtype: str = "auto"  # every method's, plain decode's included (EngineConfig.kv_cache_dtype)
    adaptive: bool = True  # EngineConfig.adaptive_speculation: False drafts every method's full tree every step
    cuda_graphs: bool = True  # on a GPU, EngineConfig.cuda_graph_tokens at its default; False: every step eager
    methods: str | None = None  # "drafter|tree;..."; None: every registered drafter with its default tree
    peers: tuple[str, ...] = PEER_NAMES
    threads: int = 1
    max_new_tokens: int = 64
    prompts_per_category: int = 2
    categories: tuple[str, ...] = SPEC_BENCH_CATEGORIES
    split: str = "test"
    out: Path = DEFAULT_OUT
    quick: bool = False
    plots: bool = True  # speedup.png and acceptance.png (matplotlib, the bench extra)

    @property
    def dummy(self) -> bool:
        return self.target.startswith("dummy:")

    def command(self) -> str:
        """The `specdec bench` line that reproduces this run (every resolved option spelled out)."""
        parts = ["specdec bench", f"--target {self.target}", f"--device {self.device}", f"--dtype {self.dtype}"]
        if self.quantize:
            parts.append(f"--quantize {self.quantize}")
        if self.kv_cache_tokens:
            parts.append(f"--kv-cache-tokens {self.kv_cache_tokens}")
        if self.kv_cache_dtype != "auto":
            parts.append(f"--kv-cache-dtype {self.kv_cache_dtype}")
        if not self.adaptive:
            parts.append("--no-adaptive")
        if not self.cuda_graphs:
            parts.append("--no-cuda-graphs")
        if self.methods is not None:
            parts.append(f"--methods '{self.methods}'")
        parts.append(f"--peers {','.join(self.peers)}" if self.peers else "--no-peers")
        parts += [f"--threads {self.threads}", f"--max-new-tokens {self.max_new_tokens}",
                  f"--prompts-per-category {self.prompts_per_category}",
                  f"--categories {','.join(self.categories)}", f"--split {self.split}"]
        return " ".join(parts)


def resolve_options(*, quick: bool = False, drafter: str | None = None, methods: str | None = None,
                    peers: str | None = None, no_peers: bool = False, max_new_tokens: int | None = None,
                    prompts_per_category: int | None = None, categories: str | None = None,
                    dtype: str | None = None, out: Path | None = None, **rest) -> SuiteOptions:
    """CLI values -> options. Options left unset take the `--quick` or the full defaults; set ones always win."""
    base = QUICK if quick else FULL
    if drafter is not None and methods is not None:
        raise ConfigError("give --drafter (one drafter against plain decode) or --methods (a list), not both")
    device = rest.get("device", "cpu")
    peer_list = () if no_peers else (_split(peers) if peers is not None else tuple(base["peers"]))
    unknown = [p for p in peer_list if p not in PEER_NAMES]
    if unknown:
        raise ConfigError(f"unknown peer(s) {', '.join(unknown)}; choose from {', '.join(PEER_NAMES)}")
    cats = _split(categories) if categories else SPEC_BENCH_CATEGORIES
    bad = [c for c in cats if c not in CATEGORIES]
    if bad:
        raise ConfigError(f"unknown categor{'y' if len(bad) == 1 else 'ies'} {', '.join(bad)}; "
                          f"choose from {', '.join(CATEGORIES)}")
    options = SuiteOptions(
        methods=drafter if drafter is not None else (methods if methods is not None else base["methods"]),
        peers=peer_list, categories=cats, quick=quick,
        dtype=dtype or ("bfloat16" if str(device).startswith("cuda") else "float32"),
        max_new_tokens=max_new_tokens if max_new_tokens is not None else base["max_new_tokens"],
        prompts_per_category=prompts_per_category if prompts_per_category is not None else base["prompts_per_category"],
        out=out if out is not None else DEFAULT_OUT, **rest)
    if options.threads < 1 or options.max_new_tokens < 1 or options.prompts_per_category < 1:
        raise ConfigError("--threads, --max-new-tokens and --prompts-per-category must be at least 1")
    if options.kv_cache_tokens is not None and options.kv_cache_tokens < 256:
        raise ConfigError("--kv-cache-tokens must be at least 256")
    EngineConfig(kv_cache_dtype=options.kv_cache_dtype)  # an unknown precision: one clear error, before loading
    return options


def check_ready(options: SuiteOptions) -> None:
    """Before anything loads: the optional packages this run needs are importable, and the output folder is
    writable. (The suite once crashed on a missing matplotlib after 81 s of benchmarking.)"""
    needed = []
    if options.plots:
        needed.append(("matplotlib", "draws the charts", "or pass --no-plots"))
    if options.peers and not options.dummy:
        needed.append(("transformers", "runs the transformers peers", "or pass --no-peers"))
    for module, why, alternative in needed:
        try:
            __import__(module)
        except ImportError:
            raise MissingDependencyError(f"specdec bench {why} with {module}, which is not installed: "
                                         f"pip install 'specdec[bench]' ({alternative})") from None
    out = Path(options.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"cannot write the bench results to {out}: {exc.strerror or exc}") from None


def _split(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


class OursRunner:
    """One of our methods: an LLM around the shared loaded target, with its own drafter."""

    family = "specdec"

    def __init__(self, key: str, label: str, llm: LLM) -> None:
        self.key, self.label, self.llm = key, label, llm

    def run(self, ids: list[int], max_new_tokens: int, ignore_eos: bool) -> Run:
        params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=ignore_eos)
        _prepare_oracle(self.llm, [ids], max_new_tokens)  # untimed, like loading a draft model's weights
        counter = DepthCounter()
        observers = getattr(self.llm.engine, "step_observers", [])  # absent: no acceptance-by-depth chart
        observers.append(counter)
        try:
            start = time.perf_counter()
            out = self.llm.generate([ids], params)[0]
            seconds = time.perf_counter() - start
        finally:
            observers.remove(counter)
        m = out.metrics
        return Run(list(out.token_ids), seconds, sum(m.accepted_per_step), m.target_steps, counter.proposed,
                   counter.accepted, m.draft_time_s)


def _prepare_oracle(llm: LLM, prompts: list[list[int]], max_new_tokens: int) -> None:
    """The oracle drafter proposes the target's own greedy continuation, computed before the timed call (a
    no-op for every other drafter, and for checkouts without the oracle)."""
    try:
        from specdec.drafters.oracle import prepare_oracle
    except ImportError:
        return
    prepare_oracle(llm, prompts, max_new_tokens)


def tree_label(llm: LLM) -> str:
    return llm.tree_spec.describe()


def build_ours(options: SuiteOptions, loaded, console: Console, notes: list[str]) -> list[OursRunner]:
    """Plain decode first (the baseline), then each method; a drafter that fails to build is skipped."""
    from specdec.drafters.registry import available

    quantize = options.quantize
    # Every method holds its own engine and KV cache; a smaller cache lets many methods share a small machine.
    config = EngineConfig(kv_cache_tokens=options.kv_cache_tokens or EngineConfig.kv_cache_tokens,
                          kv_cache_dtype=options.kv_cache_dtype, adaptive_speculation=options.adaptive,
                          cuda_graph_tokens=EngineConfig.cuda_graph_tokens if options.cuda_graphs else 0)
    runners = [OursRunner("specdec:none", "specdec plain decode",
                          LLM.from_loaded(loaded, "none", quantize=quantize, engine_config=config))]
    if options.methods is None:
        skipped = sorted(set(available()) & SYNTHETIC_DRAFTERS)
        if skipped:
            notes.append(f"synthetic drafter(s) {', '.join(skipped)} left out of the default methods; "
                         "ask for them with --drafter or --methods")
        methods = [(name, None) for name in available() if name != "none" and name not in SYNTHETIC_DRAFTERS]
    else:
        methods = [m for m in parse_methods(options.methods) if m != ("none", None)]
    for drafter, tree in methods:
        key = f"specdec:{drafter}" + (f"|{tree}" if tree else "")
        try:
            llm = LLM.from_loaded(loaded, drafter, tree, quantize=quantize, engine_config=config)
        except Exception as exc:  # e.g. a registered drafter with no trained weights for this target
            if options.methods is not None:  # asked for by name: a bad spec is the user's to fix
                raise
            note = f"skipped {key}: {type(exc).__name__}: {exc}"
            notes.append(note)
            console.print(note, style="yellow", markup=False, emoji=False)
            continue
        runners.append(OursRunner(key, f"specdec {drafter} ({tree_label(llm)})", llm))
    return runners


def select_prompts(options: SuiteOptions) -> list[dict]:
    """The first N prompts of each category's split, in category order."""
    prompts = []
    for category in options.categories:
        prompts += bench_prompts([category], options.split)[: options.prompts_per_category]
    if not prompts:
        raise ConfigError(f"no {options.split} prompts in categories {', '.join(options.categories)}")
    return prompts


def encode_messages(llm: LLM, messages: list[dict]) -> list[int]:
    """Chat-template ids for a conversation so far; models without a template (dummy targets) get the turns
    joined as plain text."""
    if getattr(llm.tokenizer, "chat_template", None):
        return llm.encode(messages)
    return llm.encode("\n\n".join(m["content"] for m in messages), chat=False)


def run_prompt(runner, prompt: dict, llm: LLM, options: SuiteOptions) -> Run:
    """All turns of one prompt by one method; each later turn follows the method's own previous reply."""
    messages: list[dict] = []
    total: Run | None = None
    for turn in prompt.get("turns") or [prompt["prompt"]]:
        messages.append({"role": "user", "content": turn})
        run = runner.run(encode_messages(llm, messages), options.max_new_tokens, ignore_eos=options.dummy)
        messages.append({"role": "assistant", "content": llm.tokenizer.decode(run.tokens, skip_special_tokens=True)})
        total = run if total is None else total + run
    assert total is not None
    return total


def run_interleaved(runners: list[tuple[Any, OursRunner]], prompts: list[dict],
                    options: SuiteOptions) -> tuple[dict[Any, Run], dict[Any, list[list[int]]]]:
    """The A/B benches' loop (bench/kv_cache_ab.py, bench/huge_pages_ab.py): a warm-up of 8 tokens each, then
    every prompt through every keyed engine in turn, once; each key's summed run and its tokens per prompt."""
    for _, runner in runners:
        first = prompts[0].get("turns", [prompts[0].get("prompt")])[0]
        runner.run(encode_messages(runner.llm, [{"role": "user", "content": first}]), 8, ignore_eos=False)
    totals: dict[Any, Run] = {}
    tokens: dict[Any, list[list[int]]] = {key: [] for key, _ in runners}
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        for key, runner in runners:
            run = run_prompt(runner, prompt, runner.llm, options)
            totals[key] = run if key not in totals else totals[key] + run
            tokens[key].append(run.tokens)
        print(f"prompt {i + 1}/{len(prompts)} ({time.perf_counter() - start:.0f} s)", flush=True)
    return totals, tokens


def run_suite(options: SuiteOptions, console: Console | None = None) -> dict:
    """Load, warm up, run every prompt through every method interleaved, and write the reports."""
    from specdec.drafters.heads.draft_folder import shipped_draft_dir
    from specdec.models.loader import load_model

    console = console or Console()
    torch.set_num_threads(options.threads)
    notes: list[str] = []
    if options.dummy:
        notes.append("dummy target (random weights): EOS is ignored, every turn generates --max-new-tokens tokens")
    if options.quantize:
        notes.append(f"specdec runs with --quantize {options.quantize}; transformers runs fp32")
    prompts = select_prompts(options)
    load_before = os.getloadavg()
    with console.status(f"loading {options.target}"):
        loaded = load_model(options.target, options.device, options.dtype, show_progress=False)
        runners = build_ours(options, loaded, console, notes)
        peers: list = []
        if options.peers and options.dummy:
            notes.append("no transformers peers: a dummy target has random weights and no checkpoint to load")
        elif options.peers:
            peers = build_peers(list(options.peers), loaded.source, shipped_draft_dir(loaded.source),
                                options.device, notes)
    base = runners[0].llm
    runners = runners + peers
    warm = encode_messages(base, [{"role": "user", "content": prompts[0]["prompt"]}])
    for runner in runners:
        runner.run(warm, min(8, options.max_new_tokens), ignore_eos=options.dummy)
    records = []
    columns = [TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("bench", total=len(prompts) * len(runners))
        for i, prompt in enumerate(prompts):
            shift = i % len(runners)
            for runner in runners[shift:] + runners[:shift]:
                progress.update(task, description=f"{prompt['category']:<13} {runner.key}")
                run = run_prompt(runner, prompt, base, options)
                records.append({"method": runner.key, "prompt": prompt.get("id", str(i)),
                                "category": prompt["category"], "run": run})
                progress.advance(task)
    methods = [{"key": r.key, "label": r.label, "family": r.family,
                "precision": _precision(r, options)} for r in runners]
    environment = {
        "python": platform.python_version(), "torch": torch.__version__, "transformers": _version("transformers"),
        "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    if str(options.device).startswith("cuda"):
        environment["gpu"] = torch.cuda.get_device_name(torch.device(options.device))
    for note in notes:
        console.print(f"note: {note}", style="dim", markup=False, emoji=False)
    return write_outputs(options, methods, records, environment, notes, console)


def _precision(runner, options: SuiteOptions) -> str:
    """The weights' precision, and the K/V cache's where it differs from the activations' (`--kv-cache-dtype
    bfloat16` changes the text and the speed: a reader of the table should see it)."""
    if runner.family != "specdec":
        return "fp32"
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}
    quantized = {"int8": "int8 W8A8", "int7": "int7 W7A8", "int4": "int4 W4A8"}.get(options.quantize or "")
    weights = quantized or names.get(getattr(torch, options.dtype), options.dtype)
    cache = runner.llm.engine.runner.cache.dtype
    activations = torch.float32 if quantized else getattr(torch, options.dtype)
    return weights if cache == activations else f"{weights}, {names.get(cache, str(cache))} K/V"


def _version(package: str) -> str:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:
        return "unknown"
