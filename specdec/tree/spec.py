"""Tree shapes as spec strings: `chain:k=5`, `static:<name|file>`, `dynamic:depth=6,topk=8,budget=60`.

A spec says how big a proposal may be and what shape it takes; the drafter fills it with tokens. Static trees
are Medusa-style choice lists: the path `(0, 1)` is "the best candidate at depth 1, then the second best
after it".
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import ConfigError
from specdec.spec_strings import parse_spec

Choice = tuple[int, ...]

# Medusa trees (head i's rank-r token at depth i + 1), built by `specdec.training.medusa.best_choice_paths` from the
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


class TreeKind(enum.Enum):
    """How a tree is shaped (the drafter fills in the tokens; `tree.growth` builds every kind)."""

    CHAIN = "chain"  # one path of `depth` drafted tokens
    STATIC = "static"  # a fixed choice list: the path (0, 1) is "best candidate, then the second best after it"
    DYNAMIC = "dynamic"  # EAGLE-2: grow by top-k per depth, keep the `budget` best nodes by cumulative score


@dataclass(frozen=True)
class TreeSpec:
    kind: TreeKind
    depth: int  # longest root-to-leaf path in drafted tokens
    topk: int  # branching per node (1 for chains)
    budget: int  # most drafted nodes (the root not counted)
    choices: tuple[Choice, ...] = ()  # static trees only, parents before children

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", TreeKind(self.kind))  # a kind given by name ("dynamic") is accepted

    @property
    def max_nodes(self) -> int:
        return self.budget + 1

    def nodes_within(self, depth: int) -> int:
        """Most drafted nodes at depth <= `depth` (what a tree cut at that depth can cost)."""
        depth = min(depth, self.depth)
        if self.kind is TreeKind.STATIC:
            return sum(1 for c in self.choices if len(c) <= depth)
        if self.kind is TreeKind.CHAIN:
            return depth
        if self.topk == 1:
            return min(depth, self.budget)
        total, width = 0, 1
        for _ in range(depth):  # stops at the budget, so huge depth or topk values cost nothing
            width = min(width * self.topk, self.budget)
            total += width
            if total >= self.budget:
                return self.budget
        return total

    def describe(self) -> str:
        """A spec string for this shape (static trees by built-in name, else by size, as their choices live in a
        file)."""
        if self.kind is TreeKind.CHAIN:
            return f"chain:k={self.depth}"
        if self.kind is TreeKind.DYNAMIC:
            return f"dynamic:depth={self.depth},topk={self.topk},budget={self.budget}"
        for name, choices in BUILTIN_TREES.items():
            if static(choices).choices == self.choices:
                return f"static:{name}"
        return f"static({self.budget} nodes, depth {self.depth})"

    def limited(self, depth: int) -> "TreeSpec":
        """The same shape, no deeper than `depth` (static trees keep their choices within that depth)."""
        if depth >= self.depth:
            return self
        if self.kind is TreeKind.STATIC:
            kept = tuple(c for c in self.choices if len(c) <= depth)
            return TreeSpec(TreeKind.STATIC, depth=depth, topk=self.topk, budget=len(kept), choices=kept)
        return TreeSpec(self.kind, depth=depth, topk=self.topk, budget=self.nodes_within(depth))


def chain(k: int) -> TreeSpec:
    if k < 0:
        raise ConfigError(f"a chain needs k >= 0, got {k}")
    return TreeSpec(TreeKind.CHAIN, depth=k, topk=1, budget=k)


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
    return TreeSpec(TreeKind.STATIC, depth=max(len(c) for c in ordered), topk=1 + max(c[-1] for c in ordered),
                    budget=len(ordered), choices=tuple(ordered))


def dynamic(depth: int, topk: int, budget: int) -> TreeSpec:
    if min(depth, topk, budget) < 1:
        raise ConfigError("dynamic trees need depth, topk and budget >= 1")
    return TreeSpec(TreeKind.DYNAMIC, depth=depth, topk=topk, budget=budget)


def choices_of(spec: TreeSpec) -> tuple[Choice, ...]:
    """A chain or static spec as its choice list (rank paths, parents first)."""
    if spec.kind is TreeKind.CHAIN:
        return tuple((0,) * d for d in range(1, spec.depth + 1))
    if spec.kind is TreeKind.STATIC:
        return spec.choices
    raise ConfigError("a dynamic tree has no fixed choice list")


def parse_tree_spec(text: str, max_nodes: int | None = None) -> TreeSpec:
    """Parse a tree spec string, checking it fits the engine's node budget."""
    name, args = parse_spec(text, what="tree")
    if name == "chain":
        k = _int(args.pop("k", "5"), "k")
        if k < 1:
            raise ConfigError(f"a chain needs k >= 1, got {k} (chain:k=0 drafts nothing: for plain decode use "
                              "drafter 'none' without a tree)")
        spec = chain(k)
    elif name == "static":
        spec = static(_load_choices(args.pop("", None) or args.pop("name", None) or args.pop("file", None)))
    elif name == "dynamic":
        depth = _int(args.pop("depth", "6"), "depth")
        topk = _int(args.pop("topk", "8"), "topk")
        budget = _int(args.pop("budget", "60"), "budget")
        if min(depth, topk, budget) >= 1 and depth > budget:
            raise ConfigError(f"a dynamic tree of budget {budget} cannot reach depth {depth}; "
                              "give depth <= budget")
        spec = dynamic(depth, topk, budget)
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


# Keys of a tree file that would describe the tree some other way: refused rather than silently ignored
_STRUCTURE_KEYS = ("parents", "tokens", "paths", "tree", "children", "depths", "edges")


def _load_choices(ref: str | None) -> list[Choice]:
    if not ref:
        raise ConfigError(f"static trees need a name or a file: static:<name|file>; names: {', '.join(BUILTIN_TREES)}")
    if ref in BUILTIN_TREES:
        return BUILTIN_TREES[ref]
    path = Path(ref).expanduser()
    if not path.is_file():
        raise ConfigError(f"no built-in tree or file named '{ref}'; built-in trees: {', '.join(BUILTIN_TREES)}")
    expected = 'expected JSON {"choices": [[0], [0, 0], ...]}: lists of integer ranks'
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read tree file {path}: {expected} ({exc})") from None
    if isinstance(data, dict):
        other = [k for k in data if k in _STRUCTURE_KEYS]
        if other:
            raise ConfigError(f"tree file {path} gives {', '.join(map(repr, other))}, which specdec does not read; "
                              f"static trees are read from \"choices\" alone ({expected})")
        if "choices" not in data:
            raise ConfigError(f"cannot read tree file {path}: it has no \"choices\" ({expected})")
        choices = data["choices"]
    else:
        choices = data
    if not isinstance(choices, list) or not all(isinstance(c, list) for c in choices):
        raise ConfigError(f"cannot read tree file {path}: {expected}")
    for c in choices:
        bad = [i for i in c if not isinstance(i, int) or isinstance(i, bool)]
        if bad:
            raise ConfigError(f"tree file {path}: choice {c} holds {bad[0]!r}, but ranks are integers (0 = the "
                              "drafter's best candidate, 1 = its second best, ...)")
    spec_choices = [tuple(c) for c in choices]
    if isinstance(data, dict):  # a file's own node count and depth, when it states them, must be the tree's
        for key, value in (("nodes", len({c for c in spec_choices})), ("depth", max(map(len, spec_choices), default=0))):
            if key in data and data[key] != value:
                raise ConfigError(f"tree file {path} says {key}={data[key]!r}, but its choices give {value}")
    return spec_choices
