"""A warm Token Recycling matrix on disk: what `recycle` learned on many requests, loaded when it starts.

Why. The matrix is the method's whole memory (`recycle_matrix.py`), and a fresh engine starts it empty: at
the first requests most rows are unseen and the drafter proposes little. The paper keeps the matrix across
requests; a server that has run for an hour holds what its traffic taught it. A *warm* matrix is that state,
saved: `specdec data recycle` answers the package's training prompts (and, if asked, ShareGPT first turns;
never the bench prompts) with the target itself and writes what the drafter learned. It is training-free all
the same: no gradient, only the target's own top-k after tokens it saw, and every proposal is still verified.

The file is an `.npz` of the rows ever written (a warm SmolLM2 matrix touches a fraction of its 49,152 rows):
row ids, successors (int32), their probabilities (float16: they rank and score nodes, three digits suffice),
and the pair rows by their (previous, token) keys, so a matrix of another `pairs` size re-hashes them. Beside
them, the tokenizer's fingerprint: a matrix of another tokenizer's ids would be noise, and is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from specdec.drafters.recycle_matrix import AdjacencyMatrix
from specdec.errors import ConfigError

ASSETS_DIR = Path(__file__).resolve().parents[1] / "assets" / "recycle"
FORMAT = 1
_STORED = {"rows": np.int32, "probs": np.float16, "pair_probs": np.float16}  # the rest as the matrix holds them


def shipped_matrix(alias: str | None) -> Path | None:
    """The warm matrix packaged for a target alias (`specdec/assets/recycle/<alias>.npz`), or None."""
    if alias is None:
        return None
    path = ASSETS_DIR / f"{alias}.npz"
    return path if path.is_file() else None


def save_matrix(matrix: AdjacencyMatrix, path: Path, fingerprint: str, info: dict | None = None) -> dict:
    """Write the rows `matrix` has seen to `path` (atomically: a reader never sees half a file); returns how
    many token rows and pair rows it wrote (also in the file's metadata)."""
    seen = matrix.seen()
    counts = {"rows": int(seen["rows"].shape[0]), "pair_rows": int(seen["pair_keys"].shape[0])}
    meta = {"format": FORMAT, "vocab_size": matrix.vocab_size, "k": matrix.k, "tokenizer_sha256": fingerprint,
            **(info or {}), **counts}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as handle:
        np.savez_compressed(handle, meta=np.array(json.dumps(meta)), **{
            name: array.astype(_STORED.get(name, array.dtype), copy=False) for name, array in seen.items()})
    partial.replace(path)
    return counts


def load_matrix(matrix: AdjacencyMatrix, path: Path, fingerprint: str) -> dict:
    """Fill an empty `matrix` from `path`; returns the file's metadata.

    A file with more successors a row than `matrix.k` gives its best k, one with fewer leaves the rest unseen,
    and any `pairs` size reads any file (`AdjacencyMatrix.restore`).
    """
    with _open(path) as data:
        try:
            meta = json.loads(str(data["meta"]))
        except (KeyError, ValueError):
            raise ConfigError(f"recycle matrix {path} has no readable metadata; rebuild it with `specdec data "
                              f"recycle`") from None
        if meta.get("format") != FORMAT:
            raise ConfigError(f"recycle matrix {path} has format {meta.get('format')}; this specdec reads {FORMAT}")
        if meta.get("vocab_size") != matrix.vocab_size or meta.get("tokenizer_sha256") != fingerprint:
            raise ConfigError(f"recycle matrix {path} was built for another tokenizer (vocabulary "
                              f"{meta.get('vocab_size')}, target {meta.get('target', '?')}); this target's "
                              f"vocabulary is {matrix.vocab_size}: build one with `specdec data recycle`")
        try:
            arrays = {name: data[name] for name in ("rows", "succ", "probs", "pair_keys", "pair_succ", "pair_probs")}
        except KeyError as exc:
            raise ConfigError(f"recycle matrix {path} lacks {exc}; rebuild it with `specdec data recycle`") from None
    arrays["rows"] = arrays["rows"].astype(np.int64)
    arrays["probs"], arrays["pair_probs"] = (arrays[n].astype(np.float32) for n in ("probs", "pair_probs"))
    matrix.restore(**arrays)
    return meta


def _open(path: Path):
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise ConfigError(f"recycle matrix {path} does not exist; build one with `specdec data recycle --out "
                          f"{path}`, or use warm=none") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"recycle matrix {path} is not readable ({exc})") from None
