"""The README's table of shipped drafter heads, from the heads' own metadata and one held-out tau run.

    python tools/drafter_table.py --measure --readme README.md     # runs bench/heldout_tau.py first (~5 min)
    python tools/drafter_table.py --tau bench/results/drafter_table/heldout_tau.json --readme README.md

Each shipped folder (`specdec/assets/{drafts,medusa,eagle}/<target>`) records how it was trained: the command,
the corpus it read (sequences, answer tokens) and the wall time (`specdec_<kind>.json`, written by the trainer).
The sizes are the folders' weight files. The tau column is what `bench/heldout_tau.py` measured on the test split
(`--tau FILE`, its JSON), for each head with the tree it runs where a verified row is cheap (first, in bold) and
where it is dear (second), plus `ngram` for reference. `--readme` replaces the rows between the two
`drafter-table` markers there; without it the table is printed. `--measure` makes the tau file first, with the
command below, so that table and numbers always come from one run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "specdec" / "assets"
TAU_FILE = ROOT / "bench" / "results" / "drafter_table" / "heldout_tau.json"
BEGIN, END = "<!-- drafter-table:begin -->", "<!-- drafter-table:end -->"
# (drafter, assets subfolder, metadata file): the trained heads, in the table's order
HEADS = (("draft", "drafts", "specdec_draft.json"), ("medusa", "medusa", "specdec_medusa.json"),
         ("eagle", "eagle", "specdec_eagle.json"))
# Each head's default tree where a verified row is cheap (AMX, GPUs), then where it is dear (AVX2, AVX-512 VNNI):
# the drafters' own defaults (specdec/drafters/{draft_model,medusa,eagle}.py), and ngram's chain for reference.
METHODS = ("draft|chain:k=5;draft|chain:k=1;medusa|static:medusa-8;medusa|dynamic:depth=2,topk=2,budget=2;"
           "eagle|dynamic:depth=5,topk=3,budget=7;eagle|chain:k=2;ngram|chain:k=5")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def measure(target: str, out: Path) -> None:
    """Held-out tau of every row's method on the test split (int8 target, full trees, 64 tokens, 14 prompts)."""
    command = [sys.executable, str(ROOT / "bench" / "heldout_tau.py"), "--target", target, "--quantize", "int8",
               "--per-category", "2", "--new-tokens", "64", "--methods", METHODS, "--out", str(out)]
    subprocess.run(command, check=True)


def head_summary(drafter: str, folder: Path, meta: dict) -> str:
    """What the head is and what it learned from, in the words of its metadata."""
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    if drafter == "medusa":
        shape = f"{config.get('medusa_num_heads', '?')} heads of {config.get('medusa_num_layers', '?')} ResBlock"
    elif drafter == "eagle":
        shape = f"EAGLE-1/2 predictor (fc + {config.get('num_hidden_layers', 1)} layer)"
    else:
        shape = f"{config.get('num_hidden_layers', '?')} decoder layers on the target's embedding"
    vocab = meta.get("draft_vocab")
    if vocab:
        shape += f", {vocab:,}-token draft vocabulary"
    corpus = meta.get("corpus", {})
    count = next((corpus[k] for k in ("sequences", "prompts", "answers") if k in corpus), None)
    answers = corpus.get("generated_tokens")
    trained = f"last trained on {count:,} sequences" if count else "last trained"
    if answers:
        trained += f" ({answers / 1e6:.2f}M answer tokens)"
    seconds = meta.get("seconds", {})
    wall = sum(v for k, v in seconds.items() if k in ("teacher", "features", "train"))
    if wall:
        trained += f", {wall / 60:.0f} min of target passes and training"
    return f"{shape}; {trained} (`{folder.relative_to(ROOT)}/README.md`: commands and history)"


def folder_size(folder: Path) -> str:
    size = sum(f.stat().st_size for f in folder.iterdir() if f.suffix in WEIGHT_SUFFIXES)
    return f"{size / 1e6:.1f} MB"


def tau_cell(rows: list[dict], drafter: str) -> str:
    mine = [r for r in rows if r["drafter"] == drafter]
    cells = [f"{r['tau']:.3f} (`{r['tree']}`)" for r in mine]
    if cells:
        cells[0] = f"**{mine[0]['tau']:.3f}** (`{mine[0]['tree']}`)"
    return ", ".join(cells) or "not measured"


def table(target: str, tau: dict) -> str:
    rows = tau["rows"]
    lines = ["| drafter | what | size | held-out tau |", "|---|---|---|---|"]
    for drafter, sub, meta_name in HEADS:
        folder = ASSETS / sub / target
        if not (folder / meta_name).is_file():
            continue
        meta = json.loads((folder / meta_name).read_text())
        lines.append(f"| `{drafter}` | {head_summary(drafter, folder, meta)} | {folder_size(folder)} | "
                     f"{tau_cell(rows, drafter)} |")
    if any(r["drafter"] == "ngram" for r in rows):
        lines.append(f"| `ngram` (no training, for reference) | prompt lookup | - | {tau_cell(rows, 'ngram')} |")
    lines += ["", f"Tau: `{tau['command']}` ({tau['prompts']} test prompts; "
              "regenerate the table with `python tools/drafter_table.py --measure --readme README.md`)."]
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise SystemExit(f"error: the README needs one '{BEGIN}' line followed by one '{END}' line")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--tau", type=Path, default=TAU_FILE, help="bench/heldout_tau.py's JSON")
    parser.add_argument("--measure", action="store_true", help="run bench/heldout_tau.py into --tau first")
    parser.add_argument("--readme", type=Path, help="write the table between the drafter-table markers here")
    args = parser.parse_args(argv)
    if args.measure:
        args.tau.parent.mkdir(parents=True, exist_ok=True)
        measure(args.target, args.tau)
    if not args.tau.is_file():
        print(f"error: no held-out tau file {args.tau}; pass --measure to make it", file=sys.stderr)
        return 2
    block = table(args.target, json.loads(args.tau.read_text()))
    if args.readme is None:
        print(block)
    else:
        args.readme.write_text(replace_block(args.readme.read_text(), block))
    return 0


if __name__ == "__main__":
    sys.exit(main())
