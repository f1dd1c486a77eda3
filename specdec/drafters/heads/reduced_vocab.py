"""Reduced-vocabulary draft heads (EAGLE-3's `d2t`/`t2d`, FR-Spec): the draft scores only the N tokens the
target emits most often, and maps its ids back to target ids.

Why: a draft's LM head over the full vocabulary is much of its cost (49,152 rows on SmolLM2, 151,936 on
Qwen2.5), and almost all of the target's output falls in a few thousand tokens. A token outside the N can
never be drafted, so it is rejected where it would have been accepted; the verifier still checks every draft
against the target, so output is unchanged (greedy equals plain greedy; sampling stays lossless because the
draft distribution is the reduced one, scattered into the full vocabulary with zeros elsewhere).

The ranking (every target id, most frequent first, in the target's answers of the training corpus) ships per
target as `specdec/assets/vocab/<alias>.safetensors` (`ranking` int32 [V], `counts` int64 [V]); `specdec data
vocab` writes it from a corpus. A drafter takes the first N ids of it (spec option `vocab=N`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

from specdec.errors import ConfigError, ModelLoadError

VOCAB_DIR = Path(__file__).resolve().parents[2] / "assets" / "vocab"
OUTSIDE = -1  # the draft id of a target token outside a reduced vocabulary


class ReducedHead(nn.Module):
    """Logits `[R, N]` over the draft vocabulary: the rows `ids` of a target-sized head. `ids[j]` is the target
    id of draft id j (ascending, so `d2t[j] = ids[j] - j` is the published offset)."""

    def __init__(self, weight: Tensor, ids: Tensor) -> None:
        super().__init__()
        if weight.shape[0] != ids.shape[0]:
            raise ValueError(f"{weight.shape[0]} head rows for {ids.shape[0]} draft ids")
        self.proj = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(weight)
        self.register_buffer("ids", ids.to(torch.int64))

    @property
    def draft_vocab(self) -> int:
        return int(self.ids.shape[0])

    def forward(self, hidden: Tensor) -> Tensor:
        return self.proj(hidden)


def head_rows(target: nn.Module, ids: Tensor) -> Tensor:
    """Float rows `ids` of a target's LM head, whatever form it has taken: tied to the embedding (which stays
    float when the target is quantized), a float Linear, or an int8 one (dequantized; the draft need not match
    the target bit for bit, only propose well)."""
    head = target.lm_head
    ids = ids.to(target.embed_tokens.weight.device)
    if target.config.tie_embeddings:
        return target.embed_tokens.weight.detach()[ids].float()
    weight = getattr(head, "weight", None)
    if isinstance(weight, Tensor) and weight.is_floating_point():
        return weight.detach()[ids].float()
    if hasattr(head, "dequantized_weight"):
        return head.dequantized_weight()[ids].float()
    if hasattr(head, "weight_int8"):
        return (head.weight_int8.float() * head.weight_scale.float()[:, None])[ids]
    raise ConfigError(f"cannot read the rows of a {type(head).__name__} head for a reduced draft vocabulary")


def reduced_from(target: nn.Module, ids: Tensor) -> ReducedHead:
    """The reduced head over `ids` (sorted ascending here) made of the target's head rows, on its device."""
    ids = ids.to(torch.int64).sort().values
    device = target.embed_tokens.weight.device
    return ReducedHead(head_rows(target, ids), ids).to(device)


def target_to_draft(ids: Tensor, vocab_size: int) -> Tensor:
    """[vocab_size] int64: each target id's draft id (its position in ascending `ids`), OUTSIDE where it has none."""
    to_draft = torch.full((vocab_size,), OUTSIDE, dtype=torch.int64)
    to_draft[ids.to(torch.int64)] = torch.arange(ids.shape[0])
    return to_draft


# --------------------------------------------------------------------------------------------- rankings
def token_counts(token_lists, vocab_size: int) -> Tensor:
    """How often each target id occurs in `token_lists` (the target's answers)."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for tokens in token_lists:
        if tokens:
            counts += torch.bincount(torch.as_tensor(tokens, dtype=torch.int64), minlength=vocab_size)[:vocab_size]
    return counts


def ranking_of(counts: Tensor) -> Tensor:
    """Every id, most frequent first (ties by id, so the ranking is deterministic)."""
    order = torch.argsort(-counts * (counts.shape[0] + 1) + torch.arange(counts.shape[0]), stable=True)
    return order.to(torch.int32)


def ranking_with_tiebreak(counts: Tensor, tiebreak: Tensor) -> Tensor:
    """Every id by `counts`, most frequent first; ids of equal count (the many an answer corpus never uses) by
    `tiebreak` (say, their frequency in the prompts' text), then by id."""
    key = counts.to(torch.float64) * (float(tiebreak.max()) + 1.0) + tiebreak.to(torch.float64)
    order = torch.argsort(-key, stable=True)
    return order.to(torch.int32)


def write_ranking(counts: Tensor, path: Path, ranking: Tensor | None = None) -> None:
    """Save `ranking` (default: `ranking_of(counts)`) with the `counts` it came from."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    ranking = ranking_of(counts) if ranking is None else ranking
    save_file({"ranking": ranking.to(torch.int32).contiguous(), "counts": counts.to(torch.int64).contiguous()},
              str(path))


def read_ranking(path: Path, vocab_size: int) -> Tensor:
    from safetensors.torch import load_file

    ranking = load_file(str(path))["ranking"].to(torch.int64)
    if ranking.shape[0] != vocab_size or sorted(ranking.tolist()) != list(range(vocab_size)):
        raise ModelLoadError(f"{path} is not a ranking of a {vocab_size}-token vocabulary")
    return ranking


def draft_vocab(alias: str | None, size: int, vocab_size: int, path: Path | None = None) -> Tensor:
    """The `size` most frequent target ids (ascending) from the shipped ranking of `alias` (or `path`)."""
    if not 1 <= size <= vocab_size:
        raise ConfigError(f"vocab={size} must be between 1 and the target's vocabulary ({vocab_size})")
    path = path or (VOCAB_DIR / f"{alias}.safetensors" if alias else None)
    if path is None or not path.is_file():
        raise ConfigError(f"no token ranking ships for this target, so vocab={size} cannot pick a draft "
                          "vocabulary; build a corpus (`specdec data build`) and rank it (`specdec data vocab`)")
    return read_ranking(path, vocab_size)[:size].sort().values


def training_draft_ids(target_name: str, size: int, answers, vocab_size: int) -> Tensor:
    """The draft vocabulary a trainer fits a reduced head to (ascending target ids): the shipped ranking's top
    `size` for a target that has one (what `vocab=N` reads at run time, so training and drafting agree), else
    the `size` most frequent tokens of the target's `answers`."""
    from specdec.drafters.heads.draft_folder import alias_of

    alias = alias_of(target_name)
    if alias and (VOCAB_DIR / f"{alias}.safetensors").is_file():
        return draft_vocab(alias, size, vocab_size)
    return ranking_of(token_counts(answers, vocab_size))[:size].long().sort().values


def recorded_draft_vocab(ref: Path, meta_name: str) -> int:
    """The draft vocabulary a drafter folder (or a file in it) records as its default in its metadata file
    `meta_name` (`draft_vocab`, as `specdec train ... --vocab N` writes it, or as chosen by measurement for a
    shipped folder); 0 (the full vocabulary) where there is none, as for published checkpoints."""
    return _recorded(ref, meta_name, "draft_vocab", lambda n: int(n or 0), 0)


def recorded_draft_ids(ref: Path, meta_name: str, vocab_size: int) -> Tensor | None:
    """The target ids a drafter folder was trained to score (`draft_ids`, as `specdec train draft --vocab N`
    writes them, so that the folder drafts over them even for a target that ships no ranking), or None."""
    def ids_of(raw: Any) -> Tensor | None:
        if not raw:
            return None
        ids = torch.tensor(raw, dtype=torch.int64)
        if ids.dim() != 1 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
            raise ValueError(f"draft_ids must be target ids below {vocab_size}")
        return ids

    return _recorded(ref, meta_name, "draft_ids", ids_of)


def _recorded(ref: Path, meta_name: str, key: str, convert: Callable[[Any], Any], missing: Any = None) -> Any:
    """`convert` of field `key` (None where absent) of a drafter folder's metadata file; `missing` where there
    is no such file. A file or value that does not parse is one ConfigError naming the file."""
    import json

    meta = (ref if ref.is_dir() else ref.parent) / meta_name
    if not meta.is_file():
        return missing
    try:
        return convert(json.loads(meta.read_text()).get(key))
    except (ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{meta} is not a readable drafter metadata file: {exc}") from None


def check_vocab_option(vocab: int, vocab_size: int) -> None:
    """A trainer's `--vocab N`: 0 (the full vocabulary) up to the target's vocabulary."""
    if not 0 <= vocab <= vocab_size:
        raise ConfigError(f"--vocab must be between 0 (the full vocabulary) and the target's {vocab_size}, "
                          f"got {vocab}")
