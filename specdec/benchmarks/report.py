"""The bench suite's results: pooled rows per method x category, Spec-Bench-style markdown, JSON and PNG charts.

Pooling: a category's tok/s is all its generated tokens over all its wall time (not a mean of per-prompt
rates, which would over-weight short answers), and tau is all decoded tokens over all target forwards.
Speedups are ratios of those pooled rates from the same interleaved runs, so `speedup_vs_plain` of a row is
exactly its `tok_s` over the plain-decode row's `tok_s` in the same category.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from specdec.benchmarks.runs import acceptance_by_depth

PLAIN, HF_PLAIN = "specdec:none", "hf:generate"
DISPLAY = {  # Spec-Bench's column names
    "conversation": "Multi-turn Conversation", "translation": "Translation", "summarization": "Summarization",
    "qa": "Question Answering", "math": "Mathematical Reasoning", "rag": "Retrieval-aug. Generation",
    "code": "Code", "overall": "Overall",
}


def aggregate(records: list[dict], method_keys: list[str], categories: list[str]) -> list[dict]:
    """One row per method and category (plus "overall"), with speedups over both baselines."""
    reference = {k: {r["prompt"]: r["run"].tokens for r in records if r["method"] == k} for k in (PLAIN, HF_PLAIN)}
    rows = []
    for method in method_keys:
        for category in [*categories, "overall"]:
            chosen = [r for r in records if r["method"] == method and category in (r["category"], "overall")]
            if not chosen:
                continue
            runs = [r["run"] for r in chosen]
            tokens, seconds = sum(len(x.tokens) for x in runs), sum(x.seconds for x in runs)
            steps = sum(x.steps for x in runs)
            row: dict[str, Any] = {
                "method": method, "category": category, "prompts": len(chosen), "tokens": tokens,
                "seconds": seconds, "tok_s": tokens / seconds if seconds > 0 else 0.0,
                "tau": sum(x.decoded for x in runs) / steps if steps else 0.0,
                "draft_ms_per_step": 1000 * sum(x.draft_seconds for x in runs) / steps if steps else 0.0,
                "step_ms": 1000 * seconds / steps if steps else 0.0,
                "acceptance_by_depth": acceptance_by_depth(runs),
            }
            for name, ref in (("same_as_plain", PLAIN), ("same_as_hf", HF_PLAIN)):
                pairs = [(r["run"].tokens, reference[ref].get(r["prompt"])) for r in chosen]
                pairs = [(a, b) for a, b in pairs if b is not None]
                row[name] = sum(a == b for a, b in pairs) / len(pairs) if pairs else None
            rows.append(row)
    index = {(r["method"], r["category"]): r for r in rows}
    for row in rows:
        for name, ref in (("speedup_vs_plain", PLAIN), ("speedup_vs_hf", HF_PLAIN)):
            base = index.get((ref, row["category"]))
            row[name] = row["tok_s"] / base["tok_s"] if base and base["tok_s"] > 0 else None
    return rows


def leaderboard(result: dict, baseline: str) -> str:
    """A Spec-Bench leaderboard table: method rows, per-category speedup, mean accepted tokens, overall."""
    field = "speedup_vs_plain" if baseline == PLAIN else "speedup_vs_hf"
    categories = result["settings"]["categories"]
    index = {(r["method"], r["category"]): r for r in result["rows"]}
    head = ["Method", "Precision", *(DISPLAY.get(c, c) for c in categories), "#Mean Accepted Tokens", "Overall"]
    same_field = "same_as_plain" if baseline == PLAIN else "same_as_hf"
    head += ["tok/s", "Same output as " + ("plain" if baseline == PLAIN else "generate")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in result["methods"]:
        overall = index.get((m["key"], "overall"))
        if overall is None:
            continue
        cells = [m["label"], m["precision"]]
        cells += [_x(index.get((m["key"], c), {}).get(field)) for c in categories]
        cells += [f"{overall['tau']:.2f}", _x(overall.get(field))]
        same = overall[same_field]
        cells += [f"{overall['tok_s']:.1f}", "" if same is None else f"{100 * same:.0f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _x(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def markdown(result: dict) -> str:
    s, env = result["settings"], result["environment"]
    ours = next(m["precision"] for m in result["methods"] if m["key"] == PLAIN)
    peers = any(m["family"] == "transformers" for m in result["methods"])
    hardware = env.get("gpu") or f"{env['cpu']}, {s['threads']} thread(s)"
    parts = [
        f"Command: `{result['command']}`",
        "",
        f"{s['target']} on {s['device']} ({hardware}), greedy, batch 1; {s['prompts_per_category']} {s['split']} "
        f"prompt(s) per category, up to {s['max_new_tokens']} new tokens per turn; specdec {ours}"
        + (f", transformers {env['transformers']} fp32" if peers else "")
        + f". {env['date']}, load average {env['loadavg_before'][0]:.1f} before / {env['loadavg_after'][0]:.1f} after.",
        "",
        "Speedup over specdec plain decode (end-to-end tok/s ratio, same interleaved runs):",
        "",
        leaderboard(result, PLAIN),
    ]
    if any(m["key"] == HF_PLAIN for m in result["methods"]):
        parts += ["", "Speedup over transformers `generate` (fp32, greedy):", "", leaderboard(result, HF_PLAIN)]
    parts += ["", "Drafting cost (all categories): the drafter's own work per target step (proposing, plus its "
              "bookkeeping after verification), against the whole step (wall time per target step, prefill "
              "included):", "", drafting_costs(result)]
    if result["notes"]:
        parts += ["", *(f"- {n}" for n in result["notes"])]
    return "\n".join(parts) + "\n"


def drafting_costs(result: dict) -> str:
    index = {(r["method"], r["category"]): r for r in result["rows"]}
    lines = ["| Drafting method | ms per step | drafting ms per step | drafting share |", "|---|---|---|---|"]
    for m in result["methods"]:
        row = index.get((m["key"], "overall"))
        if row is None or m["family"] != "specdec" or m["key"] == PLAIN:
            continue
        share = row["draft_ms_per_step"] / row["step_ms"] if row["step_ms"] else 0.0
        lines.append(f"| {m['label']} | {row['step_ms']:.1f} | {row['draft_ms_per_step']:.2f} | {100 * share:.1f}% |")
    return "\n".join(lines)


def plot(result: dict, out: Path) -> None:
    """speedup.png (per category, over each baseline) and acceptance.png (alpha by depth per drafting method)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    categories = [*result["settings"]["categories"], "overall"]
    index = {(r["method"], r["category"]): r for r in result["rows"]}
    baselines = [(PLAIN, "speedup_vs_plain", "over specdec plain decode")]
    if any(m["key"] == HF_PLAIN for m in result["methods"]):
        baselines.append((HF_PLAIN, "speedup_vs_hf", "over transformers generate (fp32)"))
    # One colour per method (tab20 has 20; the default cycle repeats after 10) and the legend beside the axes,
    # where it hides no bar.
    colours = {m["key"]: plt.get_cmap("tab20")(i % 20) for i, m in enumerate(result["methods"])}
    fig, axes = plt.subplots(len(baselines), 1, figsize=(15, 4.5 * len(baselines)), squeeze=False)
    for ax, (base, field, title) in zip(axes[:, 0], baselines):
        methods = [m for m in result["methods"] if m["key"] != base]
        width = 0.8 / max(len(methods), 1)
        for i, m in enumerate(methods):
            values = [(index.get((m["key"], c)) or {}).get(field) or 0.0 for c in categories]
            ax.bar([x + i * width for x in range(len(categories))], values, width, label=m["label"],
                   color=colours[m["key"]])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(categories))], [DISPLAY.get(c, c) for c in categories],
                      rotation=20, fontsize=8)
        ax.set_ylabel("speedup")
        ax.set_title(f"{result['settings']['target']}: speedup {title}")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(out / "speedup.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(11, 4))
    drawn = 0
    for m in result["methods"]:
        alphas = (index.get((m["key"], "overall")) or {}).get("acceptance_by_depth") or []
        if alphas:
            ax.plot(range(1, len(alphas) + 1), alphas, marker="o", label=m["label"], color=colours[m["key"]])
            drawn = max(drawn, len(alphas))
    if not drawn:
        ax.text(0.5, 0.5, "no drafting method ran", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("draft depth d")
    ax.set_ylabel("acceptance rate alpha_d")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xticks(range(1, drawn + 1))
    ax.set_title("acceptance by depth, all categories (specdec drafters)")
    if drawn:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(out / "acceptance.png", dpi=110)
    plt.close(fig)


def write_outputs(options, methods: list[dict], records: list[dict], environment: dict, notes: list[str],
                  console: Console) -> dict:
    """Aggregate, then write suite.json, suite.md, speedup.png and acceptance.png under `options.out`."""
    settings = {"target": options.target, "device": options.device, "dtype": options.dtype,
                "quantize": options.quantize, "threads": options.threads, "max_new_tokens": options.max_new_tokens,
                "prompts_per_category": options.prompts_per_category, "categories": list(options.categories),
                "split": options.split, "quick": options.quick, "peers": list(options.peers)}
    result = {"command": options.command(), "settings": settings, "environment": environment, "notes": notes,
              "methods": methods, "rows": aggregate(records, [m["key"] for m in methods], list(options.categories)),
              "runs": [{"method": r["method"], "prompt": r["prompt"], "category": r["category"],
                        "tokens": len(r["run"].tokens), "seconds": r["run"].seconds, "decoded": r["run"].decoded,
                        "steps": r["run"].steps} for r in records]}
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "suite.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (out / "suite.md").write_text(text)
    plots = getattr(options, "plots", True)
    if plots:
        plot(result, out)
    console.print(text, markup=False, emoji=False, highlight=False, soft_wrap=True)
    console.print(f"[dim]wrote {out}/suite.{{md,json}}" + (", speedup.png, acceptance.png" if plots else "") + "[/]")
    return result
