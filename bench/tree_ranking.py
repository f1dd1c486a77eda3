"""How much tau does the hybrid lose to its node ranking? Its big trees recorded, smaller budgets replayed offline.

    OMP_NUM_THREADS=1 python bench/tree_ranking.py [--fit-split dev] [--eval-split test] [--per-category 3]

Runs `hybrid:suffix+recycle` greedily with a 16-node tree (`dynamic:depth=8,topk=4,budget=16`, full trees, no
planner) over each split's prompts and records, every step, the merged tree (best-first order, calibrated
path probabilities, proposers, raw scores), the suffix draft behind it (match length, support) and, from the
final output, the true continuation. Then, per budget b, replays: the tau of the tree's first b nodes (what
the ranking verifies at budget b), an oracle's (the accepted path within the 16 candidates, cut to b) and a
logistic model's (each node's P(accepted | parent accepted) from proposers, raw and calibrated scores, depth,
sibling rank, suffix match length and support; fitted on `--fit-split`, best-first by its path products).
If the logistic ranking is close to the current one and far from the oracle, the ranking is not where tau is
lost. The calibration and the recycle matrix see 16 verified rows a step here, not b, so these taus run a
little above a budget-b run's.
"""

from __future__ import annotations

import argparse
import collections
import heapq
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec import LLM, SamplingParams  # noqa: E402
from specdec.config import EngineConfig  # noqa: E402
from specdec.data import CATEGORIES, bench_prompts  # noqa: E402
from specdec.drafters import hybrid as hybrid_module  # noqa: E402
from specdec.drafters import suffix as suffix_module  # noqa: E402

BUDGETS = (2, 3, 4, 6, 8)


def record(llm: LLM, split: str, per_category: int) -> list[tuple]:
    """(full token ids, position of the root's successor, merged tree, suffix draft) for every drafted step."""
    records, suffix_drafts = [], {}
    propose, draft = hybrid_module.HybridDrafter.propose, suffix_module.SuffixDrafter.draft

    def recording_propose(self, seqs, spec):
        trees = propose(self, seqs, spec)
        for seq in seqs:
            records.append((seq, len(seq.token_ids), self.slot(seq, hybrid_module._State).merged,
                            suffix_drafts.pop(seq.seq_id, None)))
        return trees

    def recording_draft(self, seq, spec):
        d = draft(self, seq, spec)
        suffix_drafts[seq.seq_id] = d
        return d

    hybrid_module.HybridDrafter.propose, suffix_module.SuffixDrafter.draft = recording_propose, recording_draft
    try:
        params = SamplingParams(max_new_tokens=128, temperature=0.0)
        for c in CATEGORIES:
            for p in bench_prompts([c], split)[:per_category]:
                llm.generate([p["prompt"]], params)
    finally:
        hybrid_module.HybridDrafter.propose, suffix_module.SuffixDrafter.draft = propose, draft
    return [(list(seq.token_ids), pos, merged, d) for seq, pos, merged, d in records if pos < len(seq.token_ids)]


def node_features(full: list[int], pos: int, m, d) -> tuple[list[dict | None], list[bool | None]]:
    """Per merged node: its features, and whether it was accepted given its parent was (None: parent was not)."""
    n = len(m.tokens)
    paths = [()]
    for i in range(1, n):
        paths.append(paths[m.parents[i]] + (m.tokens[i],))
    suffix_nodes = {}
    if d is not None:
        own = []
        for j, (t, p) in enumerate(zip(d.tokens, d.parents)):
            own.append((own[p] if p >= 0 else ()) + (t,))
            suffix_nodes[own[-1]] = (d.support[j], d.probs[j] / (d.probs[p] if p >= 0 else 1.0))
    kids = collections.defaultdict(list)
    for i in range(1, n):
        kids[m.parents[i]].append(i)
    cond = [1.0] + [m.probs[i] / m.probs[m.parents[i]] for i in range(1, n)]
    rank = [0] * n
    for ks in kids.values():
        for r, i in enumerate(sorted(ks, key=lambda i: -cond[i])):
            rank[i] = r
    accepted = [True] + [False] * (n - 1)
    feats, labels = [None] * n, [None] * n
    for i in range(1, n):
        p, depth = m.parents[i], m.depths[i]
        accepted[i] = accepted[p] and pos + depth - 1 < len(full) and full[pos + depth - 1] == m.tokens[i]
        s = suffix_nodes.get(paths[i])
        feats[i] = dict(depth=depth, mask=m.sources[i], raw=m.raw[i], cond=cond[i], rank=rank[i], siblings=len(kids[p]),
                        match=(d.match_len if s else 0), support=(s[0] if s else 0), suffix_cond=(s[1] if s else 0.0),
                        parent_cond=cond[p] if p else 1.0)
        labels[i] = accepted[i] if accepted[p] else None
    return feats, labels


def vector(f: dict) -> list[float]:
    log = lambda x: math.log(max(x, 1e-4))  # noqa: E731
    v = []
    for mask in (1, 2, 3):
        on = float(f["mask"] == mask)
        v += [on, on * log(f["raw"]), on * log(f["cond"]), on * min(f["depth"], 8) / 8]
    v += [float(f["rank"] == 0), float(f["rank"] == 1), f["siblings"] / 4, min(f["match"], 24) / 24,
          math.log1p(f["support"]) / 3, f["suffix_cond"], log(f["parent_cond"])]
    return v + [float(f["depth"] == k) for k in range(1, 9)]


def fit(rows: list[tuple]) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = [], []
    for full, pos, m, d in rows:
        for f, y in zip(*node_features(full, pos, m, d)):
            if f is not None and y is not None:
                xs.append(vector(f))
                ys.append(float(y))
    x, y = torch.tensor(xs), torch.tensor(ys)
    w, b = torch.zeros(x.shape[1], requires_grad=True), torch.zeros(1, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=500)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ w + b, y) + 1e-3 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), b.detach()


def replay(rows: list[tuple], score) -> dict[int, float]:
    """tau per budget when each node's conditional acceptance is `score(features)`, grown best-first."""
    total = collections.Counter()
    for full, pos, m, d in rows:
        feats, _ = node_features(full, pos, m, d)
        c = [1.0] + [score(feats[i]) for i in range(1, len(m.tokens))]
        kids = collections.defaultdict(list)
        for i in range(1, len(m.tokens)):
            kids[m.parents[i]].append(i)
        for budget in BUDGETS:
            heap = [(-c[i], i) for i in kids[0]]
            heapq.heapify(heap)
            chosen = {0}
            while heap and len(chosen) - 1 < budget:
                neg, i = heapq.heappop(heap)
                chosen.add(i)
                for k in kids[i]:
                    heapq.heappush(heap, (neg * c[k], k))
            total[budget] += accepted_length(full, pos, m, chosen)
    return {b: 1 + total[b] / len(rows) for b in BUDGETS}


def accepted_length(full: list[int], pos: int, m, nodes) -> int:
    depth_of, best = {0: 0}, 0
    for i in sorted(nodes):
        p = m.parents[i]
        if i and p in depth_of and pos + depth_of[p] < len(full) and full[pos + depth_of[p]] == m.tokens[i]:
            depth_of[i] = depth_of[p] + 1
            best = max(best, depth_of[i])
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fit-split", default="dev")
    parser.add_argument("--eval-split", default="test")
    parser.add_argument("--per-category", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    splits = {}
    for split in dict.fromkeys([args.fit_split, args.eval_split]):
        llm = LLM("smollm2-135m", drafter="hybrid:suffix+recycle", quantize="int8",
                  tree="dynamic:depth=8,topk=4,budget=16", engine_config=EngineConfig(adaptive_speculation=False),
                  show_progress=False, num_threads=1)
        splits[split] = record(llm, split, args.per_category)
    w, b = fit(splits[args.fit_split])
    print(f"hybrid:suffix+recycle, 16-node trees replayed at smaller budgets; logistic ranking fitted on "
          f"{args.fit_split} ({len(splits[args.fit_split])} steps), {args.per_category} prompts per category\n")
    print("| split | steps | ranking | " + " | ".join(f"tau at {k}" for k in BUDGETS) + " |")
    print("|---|---|---|" + "---|" * len(BUDGETS))
    for split, rows in splits.items():
        oracle = collections.Counter()
        for full, pos, m, _ in rows:
            reach = accepted_length(full, pos, m, range(len(m.tokens)))
            for k in BUDGETS:
                oracle[k] += min(reach, k)
        results = {"current (calibrated)": replay(rows, lambda f: f["cond"]),
                   "logistic": replay(rows, lambda f: float(torch.sigmoid(torch.tensor(vector(f)) @ w + b))),
                   "oracle": {k: 1 + oracle[k] / len(rows) for k in BUDGETS}}
        for name, taus in results.items():
            print(f"| {split} | {len(rows)} | {name} | " + " | ".join(f"{taus[k]:.3f}" for k in BUDGETS) + " |")


if __name__ == "__main__":
    main()
