"""Where one engine step's time goes: linears, LM head, attention, norms, verification, KV commit, drafter, Python.

    python bench/profile_step.py                                   # int8 and fp32, batch 1, plain and an 8-node tree
    python bench/profile_step.py --precision int8 --batch 1,4 --tree none --tree "dynamic:depth=4,topk=2,budget=7"
    python bench/profile_step.py --precision int8 --context 800 --ops   # + torch profiler's top ops

Each configuration (precision x batch x tree x context) decodes `--steps` timed engine steps after its prompts
are prefilled (prefill is not timed). Trees come from the `oracle` drafter (the target's own greedy continuation,
each drafted token kept with probability `--alpha`), whose proposals cost no model call, so a tree's row shows
what verifying it costs; the planner is off so every step verifies the full tree.

How the split is measured: every model module, kernel entry point and engine phase is wrapped by a timer that
charges its *exclusive* time (its own time minus that of the timed calls inside it) to a category. On CPU every
op is synchronous, so the timers see the real cost, Python around the ops included. "rest" is the step's wall
time minus every category: the engine's own Python (emitting tokens, metrics, stop checks). The wrappers add a
little overhead (about a microsecond per call); the "unwrapped ms" column is the same steps without them, and
the two are measured alternately in one process so that drift on a shared machine hits both alike.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specdec import kernels
from specdec.api import LLM
from specdec.benchmarks.command import command_line
from specdec.kernels import cpu as cpu_kernels
from specdec.models import fast_path
from specdec.config import EngineConfig, SamplingParams
from specdec.data import bench_prompts
from specdec.drafters.oracle import OracleDrafter
from specdec.models.llama import Attention, DecoderLayer, LlamaModel, MLP, RMSNorm
from specdec.models.loader import load_model
from specdec.models.quant import quantize_model_int8_
from specdec.models.rope import RotaryEmbedding

RESULTS = Path(__file__).resolve().parent / "results"
CATEGORIES = ("linears", "lm head", "attention", "kv write", "norms/rope/act", "model python", "runner inputs",
              "sampling/verify", "kv commit", "scheduler/planner", "drafter", "rest (python)")
# Modules whose own code is elementwise work between the matmuls (norms, rope, silu*up, residual adds, views).
GLUE = (RMSNorm, RotaryEmbedding, DecoderLayer, Attention, MLP, LlamaModel, nn.Embedding)


class StepTimer:
    """Exclusive wall time per category over nested timed calls."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self._children: list[float] = []
        self._undo: list[Callable[[], None]] = []

    def wrap(self, category: str, fn: Callable) -> Callable:
        clock, children, totals = time.perf_counter, self._children, self.totals

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            children.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = clock() - start
                totals[category] += elapsed - children.pop()
                if children:
                    children[-1] += elapsed

        return timed

    def patch(self, owner: Any, name: str, category: str) -> None:
        """Replace `owner.name` by a timed version (an instance attribute, or a module-level function)."""
        original = getattr(owner, name)
        had_own = isinstance(owner, type(kernels)) or name in vars(owner)
        setattr(owner, name, self.wrap(category, original))
        self._undo.append(lambda: setattr(owner, name, original) if had_own else delattr(owner, name))

    def instrument(self, llm: LLM) -> None:
        engine = llm.engine
        model = engine.runner.model
        for module in model.modules():
            if module is model.lm_head:
                self.patch(module, "forward", "lm head")
            elif isinstance(module, GLUE):
                self.patch(module, "forward", "norms/rope/act")
            elif "Linear" in type(module).__name__:
                self.patch(module, "forward", "linears")
                for name in ("forward_unit_rows", "forward_q8"):
                    if hasattr(module, name):
                        self.patch(module, name, "linears")
        for name in ("paged_attention", "decode_attention"):
            self.patch(kernels, name, "attention")
            self.patch(cpu_kernels, name, "attention")
        self.patch(kernels, "write_kv", "kv write")
        for name in ("rms_norm", "silu_mul", "quantize", "rope_kv"):  # rope_kv also writes K/V into the cache
            self.patch(cpu_kernels, name, "norms/rope/act")
        self.patch(fast_path, "forward", "model python")
        # The one-call path (all layers in one C++ op) times its own parts; `remove` moves them out of its call.
        self.patch(cpu_kernels, "decode_layers", "model python")
        fast_path.TIMINGS["decode_layers"] = torch.zeros(3, dtype=torch.float64)
        self.patch(engine.runner, "run", "runner inputs")
        self.patch(engine.runner, "commit_path", "kv commit")
        self.patch(engine, "_verify", "sampling/verify")
        self.patch(engine, "_first_token", "sampling/verify")
        self.patch(engine.scheduler, "schedule", "scheduler/planner")
        if engine.planner is not None:
            for name in ("plan", "observe_forward", "observe_draft", "observe_step"):
                self.patch(engine.planner, name, "scheduler/planner")
        self.patch(engine.drafter, "propose", "drafter")
        self.patch(engine.drafter, "commit", "drafter")
        self.patch(engine, "step", "rest (python)")

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()
        cpp = fast_path.TIMINGS.pop("decode_layers", None)
        if cpp is not None:
            for category, seconds in zip(("linears", "attention", "norms/rope/act"), cpp.tolist()):
                self.totals[category] += seconds
                self.totals["model python"] -= seconds


def context_prompts(llm: LLM, batch: int, length: int) -> list[list[int]]:
    """`batch` prompts of `length` tokens each, cut from the bench prompts' real text (different text per row)."""
    ids: list[int] = []
    for p in bench_prompts(split="dev"):
        ids += llm.encode(p["prompt"], chat=False)
    if len(ids) < batch * length:
        ids = ids * (batch * length // len(ids) + 1)
    return [ids[b * length:(b + 1) * length] for b in range(batch)]


def decode_steps(llm: LLM, prompts: list[list[int]], steps: int, timer: StepTimer | None) -> tuple[float, float]:
    """Prefill `prompts` (untimed), then time `steps` engine steps. Returns (seconds per step, tokens per step)."""
    engine = llm.engine
    if isinstance(engine.drafter, OracleDrafter):
        engine.drafter.prepare(prompts, steps * (llm.tree_spec.depth + 1) + llm.tree_spec.depth + 2)
    params = SamplingParams(max_new_tokens=steps * (llm.tree_spec.depth + 1) + 1, ignore_eos=True)
    seqs = [engine.add_request(ids, params) for ids in prompts]
    while any(not s.output_ids for s in seqs):
        engine.step()
    emitted = sum(len(s.output_ids) for s in seqs)
    if timer is not None:
        timer.instrument(llm)
    try:
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        seconds = time.perf_counter() - start
    finally:
        if timer is not None:
            timer.remove()
    tokens = sum(len(s.output_ids) for s in seqs) - emitted
    for s in seqs:
        engine.abort(s.seq_id)
    return seconds / steps, tokens / steps / len(seqs)


@contextmanager
def compiled_kernels(mode: str) -> Iterator[None]:
    """on: the compiled kernels on this CPU's best instruction set; avx512 and avx2: the same kernels held to
    that level (the same bits, at the speed of a CPU without AMX, or without AVX-512); off: the torch reference
    path (plain forward, reference attention, float64 K/V for int8), the engine as it was before the compiled
    kernels. All in this same process."""
    old = os.environ.get("SPECDEC_CPU_KERNELS")
    os.environ["SPECDEC_CPU_KERNELS"] = "0" if mode == "off" else "1"
    isa = cpu_kernels.isa() if mode != "off" and cpu_kernels.available() else None
    if isa is not None:
        cpu_kernels.isa(mode if mode in ("avx2", "avx512") else "amx")
    try:
        yield
    finally:
        if isa is not None:
            cpu_kernels.isa(isa if isa in ("amx", "avx512") else "avx2")
        if old is None:
            del os.environ["SPECDEC_CPU_KERNELS"]
        else:
            os.environ["SPECDEC_CPU_KERNELS"] = old


PRECISIONS = ("fp32", "int8", "int7", "int4", "int8-fbgemm", "int8-bf16kv", "int8-f32kv")


def build(target: str, precision: str) -> LLM:
    """fp32; int8, int7 and int4 (QLinear weights, the serving policy); int8-fbgemm (fbgemm's linears with the same
    compiled attention and norms, the linear kernel used before QLinear); int8-bf16kv and int8-f32kv (int8 with a
    bfloat16 or a float32 K/V cache; plain int8 takes the serving default, float32)."""
    if precision not in PRECISIONS:
        raise SystemExit(f"unknown precision {precision}; choose from {', '.join(PRECISIONS)}")
    kv_cache_dtype = {"-bf16kv": "bfloat16", "-f32kv": "float32"}.get(precision[precision.rfind("-"):], "auto")
    precision = precision.removesuffix("-bf16kv").removesuffix("-f32kv")
    # quantized as it loads: a 1.5B target never holds its fp32 weights
    streamed = precision in ("int8", "int7", "int4")
    loaded = load_model(target, "cpu", "float32", show_progress=False,
                        quantize=precision if streamed else None)
    config = replace(EngineConfig(), adaptive_speculation=False, kv_cache_tokens=4096, kv_cache_dtype=kv_cache_dtype)
    if precision != "fp32" and not streamed:
        quantize_model_int8_(loaded.model, bits=4 if precision == "int4" else 8, fbgemm=precision == "int8-fbgemm")
        loaded.quantized = "int4" if precision == "int4" else "int8"
    return LLM.from_loaded(loaded, quantize=loaded.quantized, engine_config=config)


def print_ops(llm: LLM, prompts: list[list[int]], steps: int, top: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        decode_steps(llm, prompts, steps, None)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--precision", default="int8,fp32", help=f"comma list of {', '.join(PRECISIONS)}")
    parser.add_argument("--kernels", default="on", help="comma list of on (compiled CPU kernels, best instruction "
                        "set), avx512 / avx2 (the same kernels held to that level), off (the torch reference path, as "
                        "before them): 'on,avx512,avx2,off' measures all of them in one process")
    parser.add_argument("--batch", default="1", help="comma list of batch sizes")
    parser.add_argument("--tree", action="append", help="tree spec (repeatable); 'none' = plain decode. "
                        "Default: none and dynamic:depth=4,topk=2,budget=7 (8 nodes with the root)")
    parser.add_argument("--context", default="64", help="comma list of prompt lengths in tokens")
    parser.add_argument("--alpha", type=float, default=0.8, help="oracle acceptance rate per drafted token")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ops", action="store_true", help="also print torch profiler's top ops per configuration")
    parser.add_argument("--out", type=Path, default=RESULTS / "profile_step.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    trees = args.tree or ["none", "dynamic:depth=4,topk=2,budget=7"]
    llms = {}
    for k in args.kernels.split(","):
        for p in args.precision.split(","):
            if k == "off" and p in ("int4", "int8-fbgemm"):
                continue  # both need the compiled kernels; without them int8 is fbgemm already
            with compiled_kernels(k):
                llms[p, k] = build(args.target, p)
            gc.collect()
    configs = [(p, int(b), t, int(c), k) for p, k in llms for b in args.batch.split(",") for t in trees
               for c in args.context.split(",")]
    samples: dict[tuple, dict[str, list]] = {c: defaultdict(list) for c in configs}

    def use(precision: str, tree: str, kernels_on: str) -> LLM:
        llm = llms[precision, kernels_on]
        llm.use("none") if tree == "none" else llm.use(f"oracle:alpha={args.alpha}", tree)
        return llm

    for config in configs:  # warm up every configuration once
        precision, batch, tree, context, k = config
        with compiled_kernels(k):
            llm = use(precision, tree, k)
            decode_steps(llm, context_prompts(llm, batch, context), 4, None)
    for _ in range(args.rounds):
        for config in configs:
            precision, batch, tree, context, k = config
            with compiled_kernels(k):
                llm = use(precision, tree, k)
                prompts = context_prompts(llm, batch, context)
                plain_s, _ = decode_steps(llm, prompts, args.steps, None)
                timer = StepTimer()
                wrapped_s, tokens = decode_steps(llm, prompts, args.steps, timer)
            s = samples[config]
            s["unwrapped"].append(plain_s)
            s["wrapped"].append(wrapped_s)
            s["tokens"].append(tokens)
            timed = sum(timer.totals.values()) / args.steps
            for cat in CATEGORIES:
                s[cat].append(timer.totals.get(cat, 0.0) / args.steps)
            s["untimed"].append(wrapped_s - timed)  # outside engine.step (the loop itself): ~0
    rows = []
    for config in configs:
        precision, batch, tree, context, k = config
        s = samples[config]
        rows.append({"precision": precision, "batch": batch, "tree": tree, "context": context, "kernels": k,
                     "ms_per_step": 1e3 * statistics.median(s["unwrapped"]),
                     "ms_per_step_wrapped": 1e3 * statistics.median(s["wrapped"]),
                     "tokens_per_step_per_seq": statistics.median(s["tokens"]),
                     "split_ms": {cat: 1e3 * statistics.median(s[cat]) for cat in CATEGORIES}})
    base = {(r["precision"], r["batch"], r["context"], r["kernels"]): r for r in rows if r["tree"] == "none"}
    for r in rows:
        plain = base.get((r["precision"], r["batch"], r["context"], r["kernels"]))
        verify = r["ms_per_step"] - r["split_ms"]["drafter"]
        r["verify_ms"] = verify
        r["verify_over_plain_step"] = verify / plain["ms_per_step"] if plain else None
    print_table(rows, args)
    result = {"target": args.target, "threads": args.threads, "steps": args.steps, "rounds": args.rounds,
              "alpha": args.alpha, "rows": rows,
              "command": command_line("bench/profile_step.py", parser, args, skip=("out",))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    if args.ops:
        for precision, batch, tree, context, k in configs:
            with compiled_kernels(k):
                llm = use(precision, tree, k)
                print(f"\n== {precision} batch {batch} tree {tree} context {context} kernels {k}")
                print_ops(llm, context_prompts(llm, batch, context), args.steps, 25)


def print_table(rows: list[dict], args: argparse.Namespace) -> None:
    head = ["config", "ms/step", "wrapped", "tok/step"] + list(CATEGORIES) + ["verify/plain"]
    print(f"\nms per engine step (median of {args.rounds} rounds x {args.steps} steps, {args.threads} thread(s))")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        name = f"{r['precision']} b{r['batch']} {r['tree']} ctx{r['context']} kernels {r['kernels']}"
        ratio = f"{r['verify_over_plain_step']:.2f}x" if r["verify_over_plain_step"] is not None else "-"
        cells = [name, f"{r['ms_per_step']:.1f}", f"{r['ms_per_step_wrapped']:.1f}",
                 f"{r['tokens_per_step_per_seq']:.2f}"] + [f"{r['split_ms'][c]:.2f}" for c in CATEGORIES] + [ratio]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
