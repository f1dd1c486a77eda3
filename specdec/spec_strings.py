"""The one parser behind every spec string: `name[:arg][,key=value...]`.

Drafters (`ngram:n=3,k=8`, `draft:smollm2-135m`) and trees (`chain:k=5`, `static:tree-16`) share this grammar,
so the CLI, the API and the bench accept the same strings.
"""

from __future__ import annotations

from specdec.errors import ConfigError


def parse_spec(text: str, what: str) -> tuple[str, dict[str, str]]:
    """`"ngram:n=3,k=8"` -> `("ngram", {"n": "3", "k": "8"})`; a bare argument is stored under the key `""`.

    The bare argument may itself contain ':' or '=' free text such as a path (`draft:/models/x`), so only
    comma-separated `key=value` items whose key is a plain identifier are split out.
    """
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"empty {what} spec")
    name, _, rest = text.strip().partition(":")
    args: dict[str, str] = {}
    if rest:
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            if eq and key.strip().isidentifier():
                args[key.strip()] = value.strip()
            elif "" not in args:
                args[""] = item.strip()
            else:
                args[""] += "," + item.strip()
    return name.strip().lower(), args


def with_options(spec: str, options: str) -> str:
    """`spec` with comma-separated `key=value` options added: `eagle` + `trees=topk` -> `eagle:trees=topk`,
    `eagle:/runs/x` + `trees=topk` -> `eagle:/runs/x,trees=topk` (a second ':' would join the path)."""
    return f"{spec},{options}" if ":" in spec else f"{spec}:{options}"
