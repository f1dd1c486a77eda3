"""Where specdec keeps what it fetches and converts: `$SPECDEC_CACHE`, else `~/.cache/specdec`.

Its own module so that the registry (aliases, downloads) and the GGUF converter both read it without
importing each other.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """`$SPECDEC_CACHE` if set, else `~/.cache/specdec`."""
    env = os.environ.get("SPECDEC_CACHE")
    return Path(env).expanduser().absolute() if env else Path.home() / ".cache" / "specdec"
