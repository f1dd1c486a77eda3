"""Write a trainer corpus (`corpus.pt`, read by `specdec train ... --corpus FILE`) from `specdec data build` folders,
in an order you choose: a shuffled mix of some folders cut to N sequences, then the records of a folder whose ids
start with a prefix (e.g. `train:`, the answers to our own training prompts), appended.

Why a file rather than repeating `--corpus`: the trainers mix repeated `--corpus` folders in proportion, and their
recorded target features are kept per slice of the corpus order. Fixing the order lets a fine-tune reuse an
earlier run's features for the sequences they share (`cp -al OLD/features NEW/` and `--resume`) and weigh one kind
of prompt up. Held-out records (every 10th of a folder, `is_held_out`) stay out, as in `--corpus FOLDER`.

    python tools/mix_corpus.py --out runs/own_corpus.pt \\
        --mix ~/.cache/specdec/corpora/smollm2-135m@9539 --mix ~/.cache/specdec/corpora/smollm2-135m-grounded \\
        --first 4000 --append ~/.cache/specdec/corpora/smollm2-135m --only-ids train: --append-seed 5

`FOLDER@N` reads only the folder's first N records (the folder as it was before later answers were appended).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

from specdec.errors import SpecdecError
from specdec.training.common import Corpus, mixed_corpus
from specdec.training.corpus_store import is_held_out, iter_records, read_manifest


def training_records(source: str, prefix: str = "") -> tuple[list[dict], tuple]:
    """The kept (not held-out) records of `FOLDER[@N]` whose id starts with `prefix`, and the folder's
    tokenizer identity (vocabulary size, tokenizer hash), which every source must share."""
    folder, _, limit = source.partition("@")
    path = Path(folder).expanduser()
    manifest = read_manifest(path)
    records = list(iter_records(path))[: int(limit) if limit else None]
    kept = [r for i, r in enumerate(records) if not is_held_out(i) and r["id"].startswith(prefix)]
    return kept, (manifest.vocab_size, manifest.tokenizer_sha256)


def as_corpus(records: list[dict]) -> Corpus:
    return Corpus([r["prompt_ids"] for r in records], [r["token_ids"] for r in records])


def main(argv: list[str] | None = None) -> int:
    try:
        return mix(argv)
    except SpecdecError as exc:  # a missing folder or manifest: one line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 1


def mix(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="corpus.pt to write")
    parser.add_argument("--mix", action="append", default=[], help="FOLDER[@N]: shuffled together (repeatable)")
    parser.add_argument("--first", type=int, default=0, help="keep the mix's first N sequences (0: all)")
    parser.add_argument("--append", action="append", default=[], help="FOLDER[@N] appended after the mix")
    parser.add_argument("--only-ids", default="", help="only appended records whose id starts with this")
    parser.add_argument("--append-seed", type=int, default=0, help="shuffle of the appended records")
    args = parser.parse_args(argv)
    identities, parts = set(), []
    for source in args.mix:
        records, identity = training_records(source)
        identities.add(identity)
        parts.append(as_corpus(records))
    mix = mixed_corpus(parts) if parts else Corpus()
    cut = args.first or len(mix.prompt_ids)
    pairs = list(zip(mix.prompt_ids[:cut], mix.response_ids[:cut]))
    appended = []
    for source in args.append:
        records, identity = training_records(source, args.only_ids)
        identities.add(identity)
        appended += [(r["prompt_ids"], r["token_ids"]) for r in records]
    if len(identities) > 1:
        print(f"error: the corpora were built for different tokenizers: {sorted(identities)}", file=sys.stderr)
        return 1
    random.Random(args.append_seed).shuffle(appended)
    pairs += appended
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"prompt_ids": [p for p, _ in pairs], "response_ids": [r for _, r in pairs], "seconds": 0.0}, args.out)
    answers = sum(len(r) for _, r in pairs)
    print(f"wrote {args.out}: {len(pairs)} sequences ({cut} mixed, {len(appended)} appended), {answers} answer tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
