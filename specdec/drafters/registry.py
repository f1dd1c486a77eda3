"""Drafters register a factory under a name; spec strings pick one. The engine has no `if name == ...` chain."""

from __future__ import annotations

from typing import Callable

from specdec.drafters.base import Drafter, DrafterContext
from specdec.errors import ConfigError
from specdec.spec_strings import parse_spec

Factory = Callable[[dict[str, str], DrafterContext], Drafter]
RawFactory = Callable[[str, DrafterContext], Drafter]
_FACTORIES: dict[str, Factory] = {}
_RAW_FACTORIES: dict[str, RawFactory] = {}  # drafters whose argument is itself a spec list (hybrid:a+b)


def register(name: str) -> Callable[[Factory], Factory]:
    def wrap(factory: Factory) -> Factory:
        _FACTORIES[name] = factory
        return factory

    return wrap


def register_raw(name: str) -> Callable[[RawFactory], RawFactory]:
    """Register a factory that gets the spec's argument text unparsed (`hybrid:suffix+recycle:k=4`)."""
    def wrap(factory: RawFactory) -> RawFactory:
        _RAW_FACTORIES[name] = factory
        return factory

    return wrap


def available() -> list[str]:
    _load_builtins()
    return sorted([*_FACTORIES, *_RAW_FACTORIES])


def build_drafter(spec: str, ctx: DrafterContext) -> Drafter:
    """`"ngram:n=3,k=8"` -> a ready drafter."""
    _load_builtins()
    name, args = parse_spec(spec, what="drafter")
    if name in _RAW_FACTORIES:
        return _RAW_FACTORIES[name](spec.strip().partition(":")[2], ctx)
    if name not in _FACTORIES:
        raise ConfigError(f"unknown drafter '{name}'; available: {', '.join(available())}")
    return _FACTORIES[name](args, ctx)


def int_arg(args: dict[str, str], key: str, default: int, minimum: int = 1) -> int:
    raw = args.pop(key, None)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"drafter option {key} must be an integer, got '{raw}'") from None
    if value < minimum:
        raise ConfigError(f"drafter option {key} must be >= {minimum}, got {value}")
    return value


def float_arg(args: dict[str, str], key: str, default: float, low: float, high: float) -> float:
    raw = args.pop(key, None)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"drafter option {key} must be a number, got '{raw}'") from None
    if not low <= value <= high:
        raise ConfigError(f"drafter option {key} must be between {low} and {high}, got {value}")
    return value


def node_planning_arg(args: dict[str, str]) -> bool:
    """Option `nodes=1` of the lookup drafters: node planning (`specdec/engine/node_planning.py`), opt-in.

    Off by default: interleaved with the depth planner on this CPU, its final form was within 2% of it at
    batch 1, and at batch 12 it ran 2% behind for suffix and ngram (ahead by 1-3% with earlier drafting rules)."""
    raw = args.pop("nodes", None)
    if raw is None or raw in ("0", "1"):
        return raw == "1"
    raise ConfigError(f"option nodes must be 0 or 1, got {raw!r}", field="drafter")


def reject_unknown(name: str, args: dict[str, str]) -> None:
    if args:
        raise ConfigError(f"unknown option(s) for drafter '{name}': {', '.join(k or repr(v) for k, v in args.items())}")


def _load_builtins() -> None:
    """Import every module of `specdec.drafters` once, so each module's @register decorator runs.

    Discovery (rather than a hand-kept import list) means a new drafter is one new file, nothing else.
    """
    import importlib
    import pkgutil

    import specdec.drafters as package

    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{info.name}")
