"""`specdec serve`: the OpenAI-compatible HTTP server (specdec.server) on uvicorn."""

from __future__ import annotations

from typing import Optional

import typer

from specdec.errors import ConfigError, SpecdecError

# `--prefill-while-decoding`'s CPU default: queued behind 8 running requests on one AVX2 core, a 360-token prompt
# prefilled whole stalled the others 0.85 s; in chunks of 64 the inter-token p99 fell from 0.86 s to 0.18 s with
# time to first token unchanged (4.4-4.6 s p50), plain decode and `suffix` alike.
CPU_PREFILL_WHILE_DECODING = 64
# The default drafter and tree: the best measured on both of the serving goals (bench/results/serve_avx2/*_guard,
# smollm2-135m int8 on one AVX2 core). Mostly one request at a time (0.2 req/s, 128 tokens, seeds 0-2) the
# hybrid on a 3-node chain lowers inter-token latency p50 1.68-1.77x; at saturation the planner's gain guard holds
# it near plain decode's throughput. `suffix` alone gave 1.07-1.64x and lost 5-8% at saturation in the same runs.
DEFAULT_DRAFTER = "hybrid:suffix+recycle"
DEFAULT_TREE = "chain:k=2"


def serve(
    target: str = typer.Option("smollm2-135m", help="Alias, HF folder, .gguf file, hub id, or dummy:<shape>."),
    device: str = typer.Option("cpu", help="cpu or cuda[:N]."),
    dtype: str = typer.Option("float32", help="float32, bfloat16 or float16."),
    quantize: Optional[str] = typer.Option(
        None, help="int8, int7 or int4 weights, int8 activations, on CPU (int7: faster tree verification on AVX2)."),
    drafter: str = typer.Option(DEFAULT_DRAFTER, help="none (plain decode), suffix, recycle, ngram[:n=3,k=8], "
                                                      "hybrid:A+B, draft, medusa, eagle, eagle3, ..."),
    tree: Optional[str] = typer.Option(
        None, help=f"chain:k=5, static:<name|file>, dynamic:depth=6,topk=8,budget=60 (default: {DEFAULT_TREE} with "
                   "the default drafter, else the drafter's own)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (0.0.0.0 for every interface)."),
    port: int = typer.Option(8000, help="TCP port (0 = any free port; the log line names it)."),
    model_name: Optional[str] = typer.Option(None, help="The model id clients send (default: --target)."),
    max_num_seqs: int = typer.Option(64, help="Most sequences in the running batch."),
    max_waiting: int = typer.Option(256, help="Most requests waiting for a batch slot; beyond it: 503."),
    kv_cache_tokens: int = typer.Option(32768, help="KV cache capacity in tokens, over all sequences."),
    kv_cache_dtype: str = typer.Option("auto", help="K/V cache precision: auto (the model's own), float32, or "
                                                    "bfloat16 (half the memory; on CPU needs AMX-BF16 or "
                                                    "AVX512-BF16)."),
    threads: Optional[int] = typer.Option(None, help="CPU threads (default: all cores but one)."),
    adaptive: bool = typer.Option(True, help="Size each sequence's tree every step for the most goodput."),
    prefix_caching: bool = typer.Option(True, help="Reuse the K/V of prompt prefixes already computed."),
    prefill_while_decoding: Optional[int] = typer.Option(
        None, help="Most prompt tokens prefilled in a step while others decode (0: no cap; default 64 on CPU, "
                   "no cap on CUDA): each one delays every running request's next token."),
    log_level: str = typer.Option("info", help="uvicorn log level: critical, error, warning, info, debug."),
) -> None:
    """Serve the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics)."""
    from specdec.cli.common import fail
    from specdec.cli.generate import load_llm

    try:
        try:
            import uvicorn

            from specdec.server import create_app
        except ImportError as exc:
            raise ConfigError(f"specdec serve needs the serve extra ({exc.name} is missing): "
                              "pip install 'specdec[serve]'") from None
        if not 0 <= port <= 65535:
            raise ConfigError(f"--port must be between 0 and 65535, got {port}")
        if max_waiting < 0:
            raise ConfigError("--max-waiting must be >= 0")
        if threads is not None and threads < 1:
            raise ConfigError("--threads must be at least 1")
        if prefill_while_decoding is not None and prefill_while_decoding < 0:
            raise ConfigError("--prefill-while-decoding must be >= 0 (0: no cap)")
        from specdec.config import EngineConfig

        if tree is None and drafter == DEFAULT_DRAFTER:
            tree = DEFAULT_TREE
        if prefill_while_decoding is None:  # a CPU step costs ~2.5 ms a prompt token for the default model
            prefill_while_decoding = 0 if device.startswith("cuda") else CPU_PREFILL_WHILE_DECODING
        config = EngineConfig(max_num_seqs=max_num_seqs, kv_cache_tokens=kv_cache_tokens, kv_cache_dtype=kv_cache_dtype,
                              adaptive_speculation=adaptive, enable_prefix_caching=prefix_caching,
                              prefill_tokens_while_decoding=prefill_while_decoding)
        llm = load_llm(target, device, dtype, quantize, drafter, tree, config, threads)
        # The id clients send is what the user named, not the folder an alias resolved to: a client of
        # `specdec serve` (target smollm2-135m) asking for model "smollm2-135m" got a 404 naming a cache path.
        server = create_app(llm, model_name or target, max_waiting)
    except SpecdecError as exc:
        fail(str(exc))
    uvicorn.run(server.app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
