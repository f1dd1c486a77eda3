"""`specdec bench`: the Spec-Bench-style suite (`specdec.benchmarks.suite`). Options and optional dependencies
are checked before anything loads, and results go to a folder of the user's (default runs/bench-suite under
the working directory), never over the repository's committed results."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specdec.cli.common import console, fail
from specdec.errors import SpecdecError


def bench(
    target: str = typer.Option("smollm2-135m", help="Target model (dummy:SHAPE targets run without peers)."),
    device: str = typer.Option("cpu", help="cpu or cuda[:N]."),
    dtype: Optional[str] = typer.Option(None, help="Our dtype (default: float32 on CPU, bfloat16 on CUDA)."),
    quantize: Optional[str] = typer.Option(None, help="int8 for our engine; transformers stays fp32."),
    drafter: Optional[str] = typer.Option(None, help="One drafter spec against plain decode (e.g. oracle:alpha=0.8)."),
    methods: Optional[str] = typer.Option(None, help="'drafter|tree;...' (default: every registered drafter)."),
    peers: Optional[str] = typer.Option(None, help="Transformers peers: generate,prompt-lookup,assisted."),
    no_peers: bool = typer.Option(False, "--no-peers", help="Run our methods only."),
    threads: int = typer.Option(1, help="CPU threads for both engines."),
    max_new_tokens: Optional[int] = typer.Option(None, help="New tokens per turn (default 64; --quick 16)."),
    prompts_per_category: Optional[int] = typer.Option(None, help="Prompts per category (default 2; --quick 1)."),
    categories: Optional[str] = typer.Option(None, help="Comma-separated (default: Spec-Bench's six)."),
    split: str = typer.Option("test", help="Prompt split: test or dev."),
    out: Optional[Path] = typer.Option(None, help="Output folder (default: runs/bench-suite under the working "
                                                  "directory)."),
    plots: bool = typer.Option(True, help="Draw speedup.png and acceptance.png (needs matplotlib: the bench "
                                          "extra); --no-plots writes the tables only."),
    quick: bool = typer.Option(False, help="CI size: 1 prompt per category, 16 tokens, none + ngram, 2 peers."),
    kv_cache_tokens: Optional[int] = typer.Option(None, help="KV cache per method's engine (default: the engine's; "
                                                           "smaller lets many methods share a small machine)."),
    kv_cache_dtype: str = typer.Option("auto", help="Every method's K/V cache precision: auto, float32, or "
                                                    "bfloat16 (on CPU needs AMX-BF16 or AVX512-BF16)."),
    adaptive: bool = typer.Option(True, help="Adaptive speculation, as `generate` runs by default; --no-adaptive "
                                             "drafts every method's full tree every step."),
    cuda_graphs: bool = typer.Option(True, help="On a GPU, replay decode and tree-verification steps from CUDA "
                                                "graphs; --no-cuda-graphs launches every kernel eagerly."),
) -> None:
    """Bench suite: our plain decode and drafters vs transformers, per Spec-Bench category."""
    given = dict(locals())
    from specdec.benchmarks import suite

    try:
        options = suite.resolve_options(**given)
        suite.check_ready(options)
        suite.run_suite(options, console)
    except SpecdecError as exc:
        fail(str(exc))
