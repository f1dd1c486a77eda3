"""Tree shapes as spec strings: `chain:k=5`, `static:<name|file>`, `dynamic:depth=6,topk=8,budget=60`.

A spec says how big a proposal may be and what shape it takes; the drafter fills it with tokens. Static trees
are Medusa-style choice lists: the path `(0, 1)` is "the best candidate at depth 1, then the second best
after it".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import ConfigError
from specdec.spec_strings import parse_spec

Choice = tuple[int, ...]

# Medusa trees (head i's rank-r token at depth i + 1), built by `specdec.training.medusa.optimal_tree` from the
# per-head top-k accuracy of the shipped smollm2-135m heads on held-out answers (see their README).
MEDUSA_TREES: dict[str, list[Choice]] = {
    "medusa-8": [(0,), (1,), (2,), (3,), (4,), (5,), (0, 0), (0, 1)],
    "medusa-16": [(0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,), (8,), (0, 0), (0, 1), (0, 2), (0, 3), (0, 4),
                  (1, 0), (2, 0)],
    "medusa-32": [(0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,), (8,), (9,), (0, 0), (0, 1), (0, 2), (0, 3), (0, 4),
                  (0, 5), (0, 6), (0, 7), (0, 8), (0, 9), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (3, 0), (4, 0),
                  (5, 0), (7, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0)],
    "medusa-64": [(0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,), (8,), (9,), (0, 0), (0, 1), (0, 2), (0, 3), (0, 4),
                  (0, 5), (0, 6), (0, 7), (0, 8), (0, 9), (1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (1, 6),
                  (1, 7), (1, 8), (1, 9), (2, 0), (2, 1), (2, 2), (2, 3), (2, 4), (3, 0), (3, 1), (3, 2), (4, 0),
                  (4, 1), (4, 2), (4, 3), (4, 4), (5, 0), (5, 1), (6, 0), (7, 0), (7, 1), (8, 0), (0, 0, 0),
                  (0, 0, 1), (0, 0, 2), (0, 0, 3), (0, 0, 4), (0, 0, 5), (0, 0, 6), (0, 1, 0), (0, 1, 1), (0, 2, 0),
                  (0, 3, 0), (0, 4, 0), (0, 6, 0), (1, 0, 0), (2, 0, 0)],
}

# Token Recycling templates (ranks in the adjacency matrix rows), chosen by measurement on the dev prompts
# with the int8 smollm2-135m target (see specdec/drafters/recycle.py).
RECYCLE_TREES: dict[str, list[Choice]] = {
    "recycle-8": [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)],
}

# Built-in static trees, denser near the root where acceptance is highest.
BUILTIN_TREES: dict[str, list[Choice]] = {
    "chain-5": [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0, 0)],
    "tree-8": [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)],
    "tree-16": [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 2), (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
                (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0), (0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 0)],
    "tree-32": [(0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (0, 0, 0), (0, 0, 1),
                (0, 0, 2), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (2, 0, 0), (0, 0, 0, 0), (0, 0, 0, 1),
                (0, 0, 1, 0), (0, 1, 0, 0), (1, 0, 0, 0), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 0, 1, 0),
                (0, 0, 1, 0, 0), (0, 0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 1), (0, 0, 0, 0, 0, 0, 0),
                (0, 0, 0, 0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 0, 0, 0, 0)],
    **MEDUSA_TREES,
    **RECYCLE_TREES,
}


@dataclass(frozen=True)
class TreeSpec:
    kind: str  # "chain" | "static" | "dynamic"
    depth: int  # longest root-to-leaf path in drafted tokens
    topk: int  # branching per node (1 for chains)
    budget: int  # most drafted nodes (the root not counted)
    choices: tuple[Choice, ...] = ()  # static trees only, parents before children

    @property
    def max_nodes(self) -> int:
        return self.budget + 1

    def nodes_within(self, depth: int) -> int:
        """Most drafted nodes at depth <= `depth` (what a tree cut at that depth can cost)."""
        depth = min(depth, self.depth)
        if self.kind == "static":
            return sum(1 for c in self.choices if len(c) <= depth)
        if self.kind == "chain":
            return depth
        return min(self.budget, sum(self.topk ** d if self.topk ** d < self.budget else self.budget
                                    for d in range(1, depth + 1)))

    def limited(self, depth: int) -> "TreeSpec":
        """The same shape, no deeper than `depth` (static trees keep their choices within that depth)."""
        if depth >= self.depth:
            return self
        if self.kind == "static":
            kept = tuple(c for c in self.choices if len(c) <= depth)
            return TreeSpec("static", depth=depth, topk=self.topk, budget=len(kept), choices=kept)
        return TreeSpec(self.kind, depth=depth, topk=self.topk, budget=self.nodes_within(depth))


def chain(k: int) -> TreeSpec:
    if k < 0:
        raise ConfigError(f"a chain needs k >= 0, got {k}")
    return TreeSpec("chain", depth=k, topk=1, budget=k)


def static(choices: list[Choice]) -> TreeSpec:
    ordered = sorted({tuple(c) for c in choices}, key=lambda c: (len(c), c))
    if not ordered:
        raise ConfigError("a static tree needs at least one choice path, e.g. [[0], [0, 0]]")
    known = set(ordered)
    for c in ordered:
        if not c or any(i < 0 for i in c):
            raise ConfigError(f"bad tree choice {c}: a path of non-negative ranks")
        if len(c) > 1 and c[:-1] not in known:
            raise ConfigError(f"tree choice {c} has no parent {c[:-1]} in the tree")
        if c[-1] > 0 and c[:-1] + (c[-1] - 1,) not in known:
            raise ConfigError(f"tree choice {c} skips its sibling rank {c[-1] - 1}")
    return TreeSpec("static", depth=max(len(c) for c in ordered), topk=1 + max(c[-1] for c in ordered),
                    budget=len(ordered), choices=tuple(ordered))


def parse_tree_spec(text: str, max_nodes: int | None = None) -> TreeSpec:
    """Parse a tree spec string, checking it fits the engine's node budget."""
    name, args = parse_spec(text, what="tree")
    if name == "chain":
        spec = chain(_int(args.pop("k", "5"), "k"))
    elif name == "static":
        spec = static(_load_choices(args.pop("", None) or args.pop("name", None) or args.pop("file", None)))
    elif name == "dynamic":
        depth = _int(args.pop("depth", "6"), "depth")
        topk = _int(args.pop("topk", "8"), "topk")
        budget = _int(args.pop("budget", "60"), "budget")
        if min(depth, topk, budget) < 1:
            raise ConfigError("dynamic trees need depth, topk and budget >= 1")
        spec = TreeSpec("dynamic", depth=depth, topk=topk, budget=budget)
    else:
        raise ConfigError(f"unknown tree kind '{name}'; use chain:k=N, static:<name|file> or "
                          "dynamic:depth=D,topk=K,budget=B")
    if args:
        raise ConfigError(f"unknown option(s) for a {name} tree: {', '.join(args)}")
    if max_nodes is not None and spec.max_nodes > max_nodes:
        raise ConfigError(f"tree '{text}' has up to {spec.max_nodes} nodes, more than the engine's budget of "
                          f"{max_nodes} (raise max_tree_nodes or use a smaller tree)")
    return spec


def _int(value: str, field: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"tree option {field} must be an integer, got '{value}'") from None


def _load_choices(ref: str | None) -> list[Choice]:
    if not ref:
        raise ConfigError(f"static trees need a name or a file: static:<name|file>; names: {', '.join(BUILTIN_TREES)}")
    if ref in BUILTIN_TREES:
        return BUILTIN_TREES[ref]
    path = Path(ref).expanduser()
    if not path.is_file():
        raise ConfigError(f"no built-in tree or file named '{ref}'; built-in trees: {', '.join(BUILTIN_TREES)}")
    try:
        data = json.loads(path.read_text())
        choices = data["choices"] if isinstance(data, dict) else data
        return [tuple(int(i) for i in c) for c in choices]
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"cannot read tree file {path}: expected JSON {{\"choices\": [[0], [0, 0], ...]}} ({exc})") from None
