"""Mutation check: plant known bugs one at a time, run the tests that guard them, restore, report.

    python tools/mutation_check.py                          # every mutant
    python tools/mutation_check.py --list                   # what would be planted, and the tests run
    python tools/mutation_check.py --only bonus-parent-row,truncate-no-release
    python tools/mutation_check.py --out bench/results/mutation_check.md

Each mutant is a one-line change to `specdec/` (the verifier, sampling, the KV cache and prefix cache, the
engine's verify-and-commit path, the draft distribution a drafter hands on) that changes behaviour: a real bug someone could write. The tests listed
with it run with `-x` and a per-test timeout, so a mutant that makes the engine hang is caught in minutes
rather than never. A mutant is *caught* when a test fails, *missed* when every test passes (a contract
without a test: write one), and *stale* when its text is no longer in the file (update the list). Tests
that caught a mutant are re-run on the unmutated tree at the end: a test that fails anyway proves nothing.

The source is always restored: the original bytes (and modification time, so no stale bytecode is ever
trusted) are written back in a `finally`, SIGINT/SIGTERM/SIGHUP unwind into it, and a journal in
`.mutation_check/` holds every original until it is restored, so a run killed outright is undone by the next
start (or by `--restore`). Exit status: 0 if every mutant was caught, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOURNAL = ROOT / ".mutation_check"

LOSSLESS = "tests/verifier/test_lossless_sampling.py::test_speculative_sampling_matches_target_distribution"
GREEDY = "tests/verifier/test_greedy.py"
TYPICAL = "tests/verifier/test_typical.py"
SAMPLING = "tests/test_sampling.py"
KVCACHE = "tests/kvcache"
ROLLBACK = "tests/engine/test_rollback.py"
BATCHING = "tests/engine/test_batching.py"
PREFIX = "tests/kvcache/test_prefix_cache.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the repository root
    old: str  # must occur exactly once in the file
    new: str
    tests: tuple[str, ...]  # pytest arguments, the contract's own test first
    why: str  # the contract the bug breaks


MUTANTS: list[Mutant] = [
    # ------------------------------------------------------------------------------------ verifier/rules.py
    Mutant("accept-q-over-p", "specdec/verifier/rules.py",
           "ratio = float(p[token]) / max(float(q[token]), 1e-30)",
           "ratio = float(q[token]) / max(float(p[token]), 1e-30)",
           (LOSSLESS,), "a draft token is accepted with probability min(1, p/q)"),
    Mutant("bonus-parent-row", "specdec/verifier/rules.py",
           "            bonus = sample(probs[node], generator)\n            return",
           "            bonus = sample(probs[path[-2]], generator)\n            return",
           (LOSSLESS,), "after a fully accepted path the bonus comes from the target's row after its last node"),
    Mutant("bonus-from-p", "specdec/verifier/rules.py",
           "            bonus = sample(p, generator)",
           "            bonus = sample(probs[node], generator)",
           (LOSSLESS,), "after a rejection the bonus comes from the residual max(p - q, 0)"),
    Mutant("residual-unnormalised", "specdec/verifier/rules.py",
           "            p = residual / total",
           "            p = residual",
           (LOSSLESS,), "later siblings are tested against the renormalised residual"),
    Mutant("residual-not-subtracted", "specdec/verifier/rules.py",
           "residual = torch.clamp(p - q, min=0.0)",
           "residual = p.clone()",
           (LOSSLESS,), "a rejected proposal's mass is taken out of p"),
    Mutant("one-hot-proposal-halved", "specdec/verifier/rules.py",
           "    q[token] = 1.0",
           "    q[token] = 0.5",
           (LOSSLESS,), "a deterministic proposal is one-hot on its token"),
    Mutant("greedy-bonus-from-root", "specdec/verifier/rules.py",
           "emitted = [tokens[i] for i in path[1:]] + [best[node]]",
           "emitted = [tokens[i] for i in path[1:]] + [best[0]]",
           (GREEDY, BATCHING), "greedy: the bonus is the target's argmax after the last accepted node"),
    Mutant("greedy-accepts-mismatch", "specdec/verifier/rules.py",
           "if tokens[c] == best[node]",
           "if tokens[c] != best[node]",
           (GREEDY, BATCHING), "greedy: a draft is accepted only if it is the target's argmax"),
    # ---------------------------------------------------------------------------------- verifier/typical.py
    Mutant("typical-floor-max", "specdec/verifier/typical.py",
           "torch.minimum(torch.full_like(entropy, threshold)",
           "torch.maximum(torch.full_like(entropy, threshold)",
           (TYPICAL,), "typical: the floor is min(threshold, alpha * exp(-entropy))"),
    Mutant("typical-bonus-from-root", "specdec/verifier/typical.py",
           "bonus = sample(probs[best], generator)",
           "bonus = sample(probs[0], generator)",
           (TYPICAL,), "typical: the bonus is sampled after the last accepted node"),
    # ----------------------------------------------------------------------------------------- sampling
    Mutant("top-p-ignored", "specdec/sampling/distribution.py",
           "    if params.top_p < 1.0:",
           "    if False:",
           (LOSSLESS, SAMPLING), "sampled output follows the top-p processed distribution"),
    Mutant("temperature-ignored", "specdec/sampling/distribution.py",
           "    logits = logits / params.temperature",
           "    logits = logits",
           (LOSSLESS, SAMPLING), "sampled output follows the tempered distribution"),
    Mutant("top-k-keeps-one-more", "specdec/sampling/distribution.py",
           "kth = logits.topk(params.top_k, dim=-1)",
           "kth = logits.topk(min(params.top_k + 1, logits.shape[-1]), dim=-1)",
           (LOSSLESS, SAMPLING), "top-k keeps exactly k tokens"),
    Mutant("top-p-drops-the-crossing-token", "specdec/sampling/distribution.py",
           "sorted_probs.masked_fill(mass_before >= top_p, 0.0)",
           "sorted_probs.masked_fill(mass_before + sorted_probs >= top_p, 0.0)",
           (LOSSLESS, SAMPLING), "top-p keeps the smallest set whose mass reaches p"),
    Mutant("uniform-squared", "specdec/sampling/distribution.py",
           "return float(torch.rand((), generator=generator, device=device).item())",
           "return float(torch.rand((), generator=generator, device=device).item()) ** 2",
           (LOSSLESS,), "acceptance tests draw u ~ U(0, 1)"),
    Mutant("seed-ignored", "specdec/sampling/distribution.py",
           "        generator.manual_seed(seed)",
           "        generator.seed()",
           (BATCHING, SAMPLING), "a seeded request samples the same tokens whatever runs beside it"),
    # --------------------------------------------------------------------------------- kvcache/paged_cache
    Mutant("truncate-stale-cached", "specdec/kvcache/paged_cache.py",
           "        del table.cached[length // self.block_size:]",
           "        pass",
           (PREFIX,), "after a truncate the table lists cache entries only for its full blocks"),
    Mutant("truncate-no-release", "specdec/kvcache/paged_cache.py",
           "        for block in table.blocks[keep:]:\n            self.pool.release(block)",
           "        for block in table.blocks[keep:]:\n            pass",
           (KVCACHE, ROLLBACK), "blocks past the end go back to the pool (every block is free after a request)"),
    Mutant("truncate-keeps-rewritten-block-cached", "specdec/kvcache/paged_cache.py",
           "            self.prefix.forget(table.blocks[keep - 1])",
           "            pass",
           (PREFIX,), "a cached block cut into and rewritten is no longer served"),
    Mutant("no-copy-on-write", "specdec/kvcache/paged_cache.py",
           "            self._copy_on_write_last(table)",
           "            pass",
           (KVCACHE,), "a write into a shared block copies it first"),
    Mutant("blocks-needed-ignores-copy-on-write", "specdec/kvcache/paged_cache.py",
           "            needed += 1",
           "            needed += 0",
           (KVCACHE,), "admission counts the block a copy-on-write will take"),
    # ------------------------------------------------------------------------------ kvcache/block_pool.py
    Mutant("revive-leaves-block-free", "specdec/kvcache/block_pool.py",
           "            del self._free[block]",
           "            pass",
           (KVCACHE,), "a revived cached block is no longer free"),
    Mutant("allocate-skips-evict", "specdec/kvcache/block_pool.py",
           "                self.on_evict(block)",
           "                pass",
           (KVCACHE,), "a free block handed out for new data leaves the prefix cache"),
    # ---------------------------------------------------------------------------- kvcache/prefix_cache.py
    Mutant("prefix-match-no-parent-check", "specdec/kvcache/prefix_cache.py",
           "if entry is None or entry.parent_id != parent_id or entry.tokens != chunk:",
           "if entry is None or entry.tokens != chunk:",
           (PREFIX,), "a hit must follow the very entry the previous block matched"),
    Mutant("prefix-match-no-token-check", "specdec/kvcache/prefix_cache.py",
           "if entry is None or entry.parent_id != parent_id or entry.tokens != chunk:",
           "if entry is None or entry.parent_id != parent_id:",
           (PREFIX,), "a hit must hold the same token ids"),
    Mutant("prefix-register-no-parent-check", "specdec/kvcache/prefix_cache.py",
           "if entry is not None and entry.parent_id == parent_id and entry.tokens == chunk:",
           "if entry is not None and entry.tokens == chunk:",
           (PREFIX,), "a block registered after a collision starts a fresh chain"),
    # ------------------------------------------------------------------------------ drafters: proposals
    Mutant("drafter-passes-untempered-q", "specdec/drafters/model_drafter.py",
           "                probs[i] = q\n",
           "                probs[i] = target_probs(self._full_vocab(logits[i: i + 1], ids), "
           "__import__('dataclasses').replace(seq.params, temperature=1.0))[0]\n",
           (LOSSLESS,), "a sampled draft token travels with the distribution it was drawn from"),
    # ------------------------------------------------------------------------- engine: verify and commit
    Mutant("commit-without-compaction", "specdec/engine/runner.py",
           "        self.cache.copy_slots(src, dst)\n        self.cache.truncate(",
           "        self.cache.truncate(",
           (ROLLBACK, BATCHING), "the accepted path's K/V is compacted into place"),
    Mutant("commit-keeps-one-less", "specdec/engine/runner.py",
           "self.cache.truncate(table, prefix_len + len(accepted_nodes))",
           "self.cache.truncate(table, prefix_len + len(accepted_nodes) - 1)",
           (ROLLBACK, BATCHING), "commit keeps the K/V of the root and every accepted node"),
    Mutant("engine-commits-root-only", "specdec/engine/engine.py",
           "self.runner.commit_path(seq.table, out.prefix_len, result.accepted_nodes)",
           "self.runner.commit_path(seq.table, out.prefix_len, result.accepted_nodes[:1])",
           ("tests/engine/test_rollback.py::test_after_every_step_the_cache_holds_every_token_but_the_last",
            BATCHING), "the engine commits the whole accepted path (not re-prefilled next step)"),
    Mutant("engine-ignores-typical", "specdec/verifier/select.py",
           'return Rule.TYPICAL if config.acceptance == "typical" else Rule.LOSSLESS',
           "return Rule.LOSSLESS",
           (TYPICAL,), "acceptance='typical' is applied to sampled requests"),
    Mutant("engine-first-token-greedy", "specdec/engine/engine.py",
           "token = int(row[0].argmax()) if params.greedy else sample(",
           "token = int(row[0].argmax()) if True else sample(",
           (LOSSLESS,), "a sampled request's first token is sampled too"),
    Mutant("engine-drops-bonus", "specdec/engine/engine.py",
           "kept = self._emit(seq, result.tokens)",
           "kept = self._emit(seq, result.tokens[:-1] or result.tokens)",
           (BATCHING, LOSSLESS), "every step emits the accepted drafts and the bonus token"),
    Mutant("engine-skips-drafter-commit", "specdec/engine/engine.py",
           "        self.drafter.commit(seqs, results)\n",
           "        pass\n",
           ("tests/drafters/test_eagle.py", "tests/drafters/test_medusa.py"),
           "feature drafters are told what was accepted"),
]


# ------------------------------------------------------------------------------------------- restoring
def _journal_entries() -> list[Path]:
    return sorted(JOURNAL.glob("*.json")) if JOURNAL.is_dir() else []


def restore_from_journal() -> list[str]:
    """Write back every original the journal still holds (a run that was killed); returns the paths."""
    restored = []
    for entry in _journal_entries():
        record = json.loads(entry.read_text())
        target = ROOT / record["path"]
        target.write_bytes(bytes.fromhex(record["original"]))
        os.utime(target, ns=(record["atime_ns"], record["mtime_ns"]))
        entry.unlink()
        restored.append(record["path"])
    return restored


class Planted:
    """Context manager: the mutant is in the file inside the block, the original is back after it."""

    def __init__(self, mutant: Mutant) -> None:
        self.mutant = mutant
        self.path = ROOT / mutant.path
        self.entry = JOURNAL / (mutant.path.replace("/", "__") + ".json")

    def __enter__(self) -> "Planted":
        self.original = self.path.read_bytes()
        self.stat = self.path.stat()
        JOURNAL.mkdir(exist_ok=True)
        self.entry.write_text(json.dumps({"path": self.mutant.path, "original": self.original.hex(),
                                          "atime_ns": self.stat.st_atime_ns, "mtime_ns": self.stat.st_mtime_ns}))
        text = self.original.decode()
        self.path.write_text(text.replace(self.mutant.old, self.mutant.new, 1))
        return self

    def __exit__(self, *exc) -> None:
        self.path.write_bytes(self.original)
        os.utime(self.path, ns=(self.stat.st_atime_ns, self.stat.st_mtime_ns))
        self.entry.unlink(missing_ok=True)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


# ---------------------------------------------------------------------------------------------- running
def pytest_command(tests: tuple[str, ...], timeout: int) -> list[str]:
    return [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", f"--timeout={timeout}", *tests]


def run_tests(tests: tuple[str, ...], timeout: int, overall: int) -> tuple[bool, str, str]:
    """(passed, first failing test or '', last lines of output)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    try:
        proc = subprocess.run(pytest_command(tests, timeout), cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=overall)
    except subprocess.TimeoutExpired:
        return False, f"(no result within {overall} s)", ""
    out = proc.stdout + proc.stderr
    failed = ""
    for line in out.splitlines():
        match = re.match(r"(FAILED|ERROR) (.+?)(?: - .*)?$", line)
        if match:
            failed = match.group(2)
            break
    return proc.returncode == 0, failed or ("" if proc.returncode == 0 else f"(pytest exit {proc.returncode})"), \
        "\n".join(out.splitlines()[-15:])


def check(mutants: list[Mutant], timeout: int, overall: int, verbose: bool) -> list[dict]:
    rows = []
    for i, mutant in enumerate(mutants, 1):
        path = ROOT / mutant.path
        count = path.read_text().count(mutant.old) if path.is_file() else 0
        row = {"name": mutant.name, "path": mutant.path, "why": mutant.why, "tests": list(mutant.tests)}
        if count != 1:
            row.update(result="stale", detail=f"text found {count} times in {mutant.path}", seconds=0.0)
        else:
            start = time.perf_counter()
            with Planted(mutant):
                passed, failed, tail = run_tests(mutant.tests, timeout, overall)
            row.update(result="missed" if passed else "caught", detail=failed,
                       seconds=round(time.perf_counter() - start, 1))
            if verbose and passed:
                print(tail)
        rows.append(row)
        print(f"[{i}/{len(mutants)}] {row['result']:6} {mutant.name}  {row['detail']}  ({row['seconds']} s)",
              flush=True)
    return rows


def confirm_catchers(rows: list[dict], timeout: int, overall: int) -> None:
    """The tests that caught mutants must pass on the real code, or they proved nothing."""
    catchers = sorted({r["detail"] for r in rows if r["result"] == "caught" and "::" in r["detail"]})
    for test in catchers:
        passed, _, tail = run_tests((test,), timeout, overall)
        if not passed:
            print(f"!! {test} fails without any mutant:\n{tail}")
            for r in rows:
                if r["detail"] == test:
                    r["result"] = "unproven"


def markdown(rows: list[dict]) -> str:
    caught = sum(r["result"] == "caught" for r in rows)
    lines = [f"# Mutation check: {caught} of {len(rows)} mutants caught", "",
             "Written by `python tools/mutation_check.py`. Each mutant is planted alone, its tests run with `-x`.", "",
             "| mutant | file | contract | result | first failing test | s |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['path']} | {r['why']} | {r['result']} | {r['detail']} | {r['seconds']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the mutants and their tests, plant nothing")
    parser.add_argument("--only", help="comma-separated mutant names")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per test (pytest-timeout)")
    parser.add_argument("--overall", type=int, default=3600, help="seconds per mutant, all its tests together")
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    parser.add_argument("--restore", action="store_true", help="only undo a killed run from the journal")
    parser.add_argument("--verbose", action="store_true", help="show pytest's output for missed mutants")
    args = parser.parse_args()
    restored = restore_from_journal()
    if restored:
        print(f"restored from an interrupted run: {', '.join(restored)}")
    if args.restore:
        return 0
    mutants = MUTANTS
    if args.only:
        names = args.only.split(",")
        unknown = sorted(set(names) - {m.name for m in MUTANTS})
        if unknown:
            parser.error(f"unknown mutants: {', '.join(unknown)}")
        mutants = [m for m in MUTANTS if m.name in names]
    if args.list:
        for m in mutants:
            print(f"{m.name}: {m.path}: {m.why}\n    tests: {' '.join(m.tests)}")
        return 0
    if importlib.util.find_spec("pytest_timeout") is None:
        parser.error("pytest-timeout is not installed (pip install -e '.[test]'): without it a hang never ends")
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_interrupt)
    rows = check(mutants, args.timeout, args.overall, args.verbose)
    confirm_catchers(rows, args.timeout, args.overall)
    text = markdown(rows)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if all(r["result"] == "caught" for r in rows) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted: every planted file is restored", file=sys.stderr)
        sys.exit(130)
