"""Serving benchmark: Poisson arrivals against running `specdec serve` servers, plain decode vs speculation.

One server per method starts first (an idle server costs no CPU: its engine thread sleeps on its inbox). Then,
for each request rate, every method serves the same arrival schedule and the same requests (bench prompts of
the test split, chat template, greedy, up to --max-tokens each, stopping at EOS), methods alternating order from
rate to rate so that drift on a shared machine does not favour one. Each run draws requests no run before it
used, so drafters that learn across requests are not measured on answers they have already seen. Requests
stream through the chat endpoint.

Per run: TTFT (send to first token) and inter-token latency (ITL) p50/p99, TPOT p50, output tok/s, and goodput
(requests per second that met both --slo-ttft and --slo-tpot). ITL is per token: a chunk of k tokens that
arrives t after the previous chunk counts k tokens of t/k each (speculation emits several tokens per step; a
per-chunk figure would count a 4-token step as one slow token). `inf` is saturation: every request at once.

If llama-cpp-python's server is installed and --llama-cpp-gguf names a GGUF file, it runs at the same rates
as a peer (its streams carry one token per chunk).

    python bench/serve.py --quantize int8 --methods "none;ngram|chain:k=8;eagle" --rates 0.5,1,2,inf

Writes <out>/serve.{json,md,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import openai

from specdec.data import bench_prompts

RESULTS = Path(__file__).parent / "results" / "serve"


@dataclass
class Record:
    sent: float
    first: float | None = None
    done: float | None = None
    tokens: int = 0
    gaps: list[float] = field(default_factory=list)  # per-token latencies after the first token
    tau: float | None = None
    error: str | None = None
    text: str = ""


def start_server(name: str, cmd: list[str], env: dict) -> tuple[subprocess.Popen, str]:
    """Start a server on a free port; returns it and its /v1 URL once it listens."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            raise SystemExit(f"{name}: the server exited before listening")
        match = re.search(r"running on http://([\d.]+):(\d+)", line)
        if match:
            threading_drain(proc)
            return proc, f"http://{match.group(1)}:{match.group(2)}/v1"
    raise SystemExit(f"{name}: the server did not start in time")


def threading_drain(proc: subprocess.Popen) -> None:
    """Keep reading the server's log so a full pipe never blocks it."""
    import threading

    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()


async def one_request(client: openai.AsyncOpenAI, model: str, prompt: str, max_tokens: int, delay: float,
                      t0: float, chat: bool) -> Record:
    await asyncio.sleep(max(0.0, t0 + delay - time.perf_counter()))
    rec = Record(sent=time.perf_counter())
    last = None
    try:
        if chat:
            stream = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                          max_tokens=max_tokens, temperature=0, stream=True)
        else:
            stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                                     stream=True)
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices:
                rec.text += (chunk.choices[0].delta.content if chat else chunk.choices[0].text) or ""
            extra = (chunk.model_extra or {}).get("specdec") or {}
            n = extra.get("num_tokens")
            if n is None:  # a peer without the extension: one token per content chunk
                n = 1 if chunk.choices and (chunk.choices[0].delta.content if chat else chunk.choices[0].text) else 0
            if "tau" in extra:
                rec.tau = extra["tau"]
            if not n:
                continue
            if last is None:
                rec.first = now
                rec.gaps += [0.0] * (n - 1)
            else:
                rec.gaps += [(now - last) / n] * n
            last = now
            rec.tokens += n
    except openai.APIError as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
    rec.done = time.perf_counter()
    return rec


async def run_load(url: str, prompts: list[str], delays: list[float], args: argparse.Namespace) -> list[Record]:
    async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=3600) as client:
        t0 = time.perf_counter()
        records = await asyncio.gather(*(one_request(client, "bench", p, args.max_tokens, d, t0, args.endpoint == "chat")
                                         for p, d in zip(prompts, delays)))
    failed = [r.error for r in records if r.error]
    if failed:
        print(f"{len(failed)} requests failed, first: {failed[0]}", flush=True)
    return records


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def summarise(runs: list[list[Record]], slo_ttft: float, slo_tpot: float) -> dict:
    """Over every repeat of one (method, rate): latency percentiles over all requests, rates over all runs."""
    records = [r for run in runs for r in run]
    ok = [r for r in records if r.error is None and r.first is not None]
    ttft = [r.first - r.sent for r in ok]
    itl = [g for r in ok for g in r.gaps]
    tpot = [(r.done - r.first) / (r.tokens - 1) for r in ok if r.tokens > 1]
    span = sum(max(r.done for r in run) - min(r.sent for r in run) for run in runs)
    good = [r for r in ok if r.first - r.sent <= slo_ttft and (r.tokens <= 1 or (r.done - r.first) / (r.tokens - 1)
                                                                <= slo_tpot)]
    taus = [r.tau for r in ok if r.tau is not None]
    return {"requests": len(records), "errors": len(records) - len(ok), "ttft_p50": pct(ttft, 0.5),
            "ttft_p99": pct(ttft, 0.99), "itl_p50": pct(itl, 0.5), "itl_p99": pct(itl, 0.99),
            "tpot_p50": pct(tpot, 0.5), "output_tok_s": sum(r.tokens for r in ok) / span,
            "goodput_req_s": len(good) / span, "slo_met": len(good) / len(records),
            "tau": statistics.mean(taus) if taus else None, "seconds": span}


def method_command(spec: str, args: argparse.Namespace) -> list[str]:
    drafter, _, tree = spec.partition("|")
    cmd = [sys.executable, "-m", "specdec.cli", "serve", "--target", args.target, "--port", "0",
           "--threads", str(args.threads), "--drafter", drafter, "--model-name", "bench", "--log-level", "info",
           "--max-num-seqs", str(args.max_num_seqs), "--max-waiting", "100000",
           "--kv-cache-tokens", str(args.kv_cache_tokens)]
    if tree:
        cmd += ["--tree", tree]
    if args.quantize:
        cmd += ["--quantize", args.quantize]
    if args.prefill_while_decoding is not None:
        cmd += ["--prefill-while-decoding", str(args.prefill_while_decoding)]
    return cmd


def llama_cpp_command(args: argparse.Namespace) -> list[str] | None:
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None or not args.llama_cpp_gguf:
        return None
    return [sys.executable, "-m", "llama_cpp.server", "--model", args.llama_cpp_gguf, "--model_alias", "bench",
            "--host", "127.0.0.1", "--port", str(args.llama_cpp_port), "--n_threads", str(args.threads)]


def plot(results: dict, rates: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = list(range(len(rates)))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for method, by_rate in results.items():
        for ax, key, label in ((axes[0], "itl_p50", "ITL p50 (ms)"), (axes[1], "ttft_p50", "TTFT p50 (ms)"),
                               (axes[2], "output_tok_s", "output tok/s")):
            scale = 1 if key == "output_tok_s" else 1000
            ax.plot(xs, [by_rate[r][key] * scale for r in rates], marker="o", label=method)
            ax.set_ylabel(label)
    for ax in axes:
        ax.set_xticks(xs, rates)
        ax.set_xlabel("request rate (req/s; inf = all at once)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("specdec serve: latency and throughput against load")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--quantize", default="int8")
    parser.add_argument("--methods", default="none;ngram|chain:k=8", help="'drafter|tree;...' (first = baseline)")
    parser.add_argument("--rates", default="0.5,1,2,inf")
    parser.add_argument("--requests", type=int, default=24, help="requests per run")
    parser.add_argument("--repeats", type=int, default=1, help="runs per (method, rate), interleaved")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--endpoint", choices=("chat", "completions"), default="chat",
                        help="completions for targets without a chat template (dummy:<shape>)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--prefill-while-decoding", type=int, default=None,
                        help="the server's option (default: its own, 64 on CPU)")
    parser.add_argument("--kv-cache-tokens", type=int, default=16384,
                        help="per server (int8 keeps K/V in float32 on the compiled kernels, float64 without them)")
    parser.add_argument("--slo-ttft", type=float, default=2.0, help="goodput target: TTFT seconds")
    parser.add_argument("--slo-tpot", type=float, default=0.1, help="goodput target: seconds per output token")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--llama-cpp-gguf", default=None, help="GGUF for the llama-cpp-python peer (if installed)")
    parser.add_argument("--llama-cpp-port", type=int, default=8765)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    rates = args.rates.split(",")
    # Every run gets requests no server has seen: drafters that learn from earlier outputs (suffix's global
    # trie, recycle's matrix) would otherwise be measured on memorised answers. Warm-up uses dev prompts.
    rng = random.Random(args.seed)
    pool = [r["prompt"] for r in bench_prompts(split="test")]
    rng.shuffle(pool)
    warm_up = [r["prompt"] for r in bench_prompts(split="dev")][:4]
    needed = len(rates) * args.repeats * args.requests
    if needed > len(pool):
        print(f"warning: {needed} requests over {len(pool)} test prompts: later runs repeat prompts, which "
              "drafters that learn across requests have seen", file=sys.stderr)

    def requests_of(run: int) -> list[str]:
        return [pool[(run * args.requests + k) % len(pool)] for k in range(args.requests)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "COLUMNS": "200"}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed bench still stops its servers
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        for spec in args.methods.split(";"):
            servers[spec] = start_server(spec, method_command(spec, args), env)
        peer = llama_cpp_command(args)
        if peer is not None:
            proc = subprocess.Popen(peer, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            time.sleep(20)
            servers["llama.cpp"] = (proc, f"http://127.0.0.1:{args.llama_cpp_port}/v1")
        for name, (_, url) in servers.items():  # warm-up: first-call costs, the planner's first measurements
            asyncio.run(run_load(url, warm_up, [0.0] * len(warm_up), args))
        results: dict[str, dict] = {name: {} for name in servers}
        for i, rate in enumerate(rates):
            r = float(rate)
            runs: dict[str, list] = {name: [] for name in servers}
            for repeat in range(args.repeats):  # a fresh schedule each repeat; methods alternate who goes first
                gaps = [0.0] * args.requests if math.isinf(r) else [rng.expovariate(r) for _ in range(args.requests)]
                delays = [sum(gaps[: k + 1]) - gaps[0] for k in range(args.requests)]
                names = list(servers) if (i + repeat) % 2 == 0 else list(servers)[::-1]
                chosen = requests_of(i * args.repeats + repeat)  # the same requests for every method
                for name in names:
                    runs[name].append(asyncio.run(run_load(servers[name][1], chosen, delays, args)))
            base = next(iter(servers))
            for name in servers:
                results[name][rate] = s = summarise(runs[name], args.slo_ttft, args.slo_tpot)
                pairs = [(a.text, b.text) for run_a, run_b in zip(runs[name], runs[base]) for a, b in zip(run_a, run_b)]
                s["same_text_as_plain"] = sum(a == b for a, b in pairs) / len(pairs)
                print(f"rate {rate:>4} {name:<24} ITL p50 {s['itl_p50'] * 1000:6.1f} ms  p99 "
                      f"{s['itl_p99'] * 1000:6.1f}  TTFT p50 {s['ttft_p50'] * 1000:7.1f} ms  "
                      f"{s['output_tok_s']:6.1f} tok/s  goodput {s['goodput_req_s']:.2f} req/s  "
                      f"tau {s['tau'] or 0:.2f}  errors {s['errors']}", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(60)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    (args.out / "serve.json").write_text(json.dumps({"args": meta, "results": results}, indent=1))
    write_table(results, rates, args, args.out / "serve.md")
    plot(results, rates, args.out / "serve.png")
    print(f"wrote {args.out}/serve.{{json,md,png}}")


def write_table(results: dict, rates: list[str], args: argparse.Namespace, path: Path) -> None:
    base = next(iter(results))
    lines = ["| rate (req/s) | method | ITL p50 ms | ITL p99 ms | TPOT p50 ms | TTFT p50 ms | TTFT p99 ms | "
             "output tok/s | goodput req/s | tau | ITL p50 vs plain | tok/s vs plain | same text as plain |",
             "|" + "---|" * 13]
    for rate in rates:
        for name, by_rate in results.items():
            s, b = by_rate[rate], results[base][rate]
            label = name.replace("|", " \\| ")
            lines.append(f"| {rate} | {label} | {s['itl_p50'] * 1000:.1f} | {s['itl_p99'] * 1000:.1f} | "
                         f"{s['tpot_p50'] * 1000:.1f} | {s['ttft_p50'] * 1000:.0f} | {s['ttft_p99'] * 1000:.0f} | "
                         f"{s['output_tok_s']:.1f} | {s['goodput_req_s']:.2f} | {s['tau'] or 0:.2f} | "
                         f"{_ratio(b['itl_p50'], s['itl_p50'])} | {_ratio(s['output_tok_s'], b['output_tok_s'])} | "
                         f"{s.get('same_text_as_plain', 0):.0%} |")
    lines.append("")
    lines.append(f"{args.requests} requests per run, {args.repeats} run(s) per method and rate, up to {args.max_tokens} new tokens, greedy, target "
                 f"{args.target} ({args.quantize or 'fp32'}), {args.threads} thread(s) per server; goodput: TTFT <= "
                 f"{args.slo_ttft} s and TPOT <= {args.slo_tpot * 1000:.0f} ms.")
    path.write_text("\n".join(lines) + "\n")


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b and not math.isnan(a / b) else "-"


if __name__ == "__main__":
    main()
