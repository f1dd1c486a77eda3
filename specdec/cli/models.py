"""`specdec models`: the default-model aliases, and what the cache holds (no torch import: instant)."""

from __future__ import annotations

from specdec.cli.common import console


def models() -> None:
    """List the default-model aliases and the models converted in the cache, with their size on disk."""
    from rich.table import Table

    from specdec.models import registry

    table = Table(title="aliases")
    for col in ("name", "description", "cached"):
        table.add_column(col)
    cached = {m["name"]: m for m in registry.list_cached_models()}
    for name, alias in registry.ALIASES.items():
        table.add_row(name, alias.description, "yes" if name in cached else "no")
    console.print(table)
    if cached:
        listing = Table(title=f"cache: {registry.cache_root()}")
        for col in ("name", "path", "size"):
            listing.add_column(col)
        for m in cached.values():
            listing.add_row(str(m["name"]), str(m["path"]), f"{m['size_bytes'] / 1e6:.0f} MB")
        console.print(listing)
    downloads = registry.downloads_size()
    if downloads:
        console.print(f"downloads kept in {registry.cache_root() / 'downloads'}: {downloads / 1e6:.0f} MB "
                      "(safe to delete once converted)")
