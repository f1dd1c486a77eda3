"""Medusa heads: the module, and the loader/writer for their checkpoints (ours and the published layout).

Head i (0-based) reads the target's final-norm hidden state at position t and predicts the token at t + i + 2:
the target's own LM head already gives t + 1. Each head is L ResBlocks `x + SiLU(W x + b)` followed by a
projection to the vocabulary, either its own `[V, H]` matrix or the target's LM head, shared.

Files, as published by FasterDecoding/Medusa: a folder with `config.json` (`medusa_num_heads`,
`medusa_num_layers`) and `medusa_lm_head.safetensors` or `medusa_lm_head.pt`, keys `{i}.{j}.linear.weight`,
`{i}.{j}.linear.bias` for ResBlock j of head i and `{i}.{L}.weight` for its projection. Our own folders use the
same keys and simply leave the projections out, which means "the target's LM head": that is how the heads were
trained, and it keeps a 4-head file at ~2.7 MB instead of 230 MB. A published projection that equals the
target's LM head (Medusa initialises them as copies) is dropped at load time for the same reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdec.errors import ModelLoadError

SAFETENSORS_FILE = "medusa_lm_head.safetensors"
PT_FILE = "medusa_lm_head.pt"
CONFIG_FILE = "config.json"
ASSETS_DIR = Path(__file__).resolve().parents[2] / "assets" / "medusa"


class MedusaHeads(nn.Module):
    """K heads of L ResBlocks, computed for all heads and rows at once (one batched matmul per layer)."""

    def __init__(self, num_heads: int, num_layers: int, hidden_size: int, vocab_size: int,
                 lm_head: nn.Module | None = None, projections: Tensor | None = None) -> None:
        super().__init__()
        if lm_head is None and projections is None:
            raise ValueError("Medusa heads need the target's LM head or their own projections")
        self.num_heads, self.num_layers = num_heads, num_layers
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        # Zero ResBlocks are the identity: an untrained head starts as the target's next-token predictor.
        self.weight = nn.Parameter(torch.zeros(num_heads, num_layers, hidden_size, hidden_size))  # [K, L, H, H]
        self.bias = nn.Parameter(torch.zeros(num_heads, num_layers, hidden_size))  # [K, L, H]
        # [K, V, H] the heads' own projections, or None: the target's LM head
        self.projections = nn.Parameter(projections, requires_grad=False) if projections is not None else None
        self._shared = [lm_head]  # a list, so the target's module is neither a submodule nor in state_dict
        self.blocks: nn.ModuleList | None = None  # per-(head, layer) linears once `as_linears` made them

    @property
    def lm_head(self) -> nn.Module | None:
        return self._shared[0]

    def as_linears(self) -> nn.ModuleList:
        """The ResBlocks as one nn.Linear per (head, layer), which `residual` then uses: the form in which a
        drafter's linears go int8 beside an int8 target (`quantize_drafter_int8_`). In float32 the four
        576-wide heads' 5 MB leave the cache during the target's pass, and reading them back was most of
        a proposal's time."""
        blocks = nn.ModuleList()
        for i in range(self.num_heads):
            for j in range(self.num_layers):
                linear = nn.Linear(self.hidden_size, self.hidden_size)
                with torch.no_grad():
                    linear.weight.copy_(self.weight[i, j])
                    linear.bias.copy_(self.bias[i, j])
                blocks.append(linear)
        self.blocks = blocks.requires_grad_(False)
        return blocks

    def residual(self, hidden: Tensor, heads: int | None = None) -> Tensor:
        """[B, H] -> [K', B, H]: the ResBlocks of the first K' = `heads` heads (all by default) over the same rows."""
        k = self.num_heads if heads is None else min(heads, self.num_heads)
        if self.blocks is not None:
            outs = []
            for i in range(k):
                x = hidden.float()
                for j in range(self.num_layers):
                    x = x + F.silu(self.blocks[i * self.num_layers + j](x))
                outs.append(x)
            return torch.stack(outs)
        x = hidden.to(self.weight.dtype).unsqueeze(0).expand(k, -1, -1)
        for j in range(self.num_layers):
            x = x + F.silu(torch.baddbmm(self.bias[:k, j, None, :], x, self.weight[:k, j].transpose(1, 2)))
        return x

    def forward(self, hidden: Tensor, heads: int | None = None) -> Tensor:
        """[B, H] final-norm hidden states -> [B, K', V] logits of the first K' = `heads` heads (head i: the token
        i + 2 ahead). A tree the planner cut to one depth reads one head: computing the other three cost 0.3 ms
        of a 1 ms proposal on the default model, their weights being out of cache after the target's pass."""
        x = self.residual(hidden, heads)
        k, b, h = x.shape
        if self.projections is not None:
            logits = torch.bmm(x, self.projections[:k].transpose(1, 2))
        else:
            logits = self.lm_head(x.reshape(k * b, h).to(_input_dtype(self.lm_head, x.dtype))).view(k, b, -1)
        return logits.transpose(0, 1)

    def state_tensors(self) -> dict[str, Tensor]:
        """The published key layout; projections only when the heads own them."""
        out: dict[str, Tensor] = {}
        for i in range(self.num_heads):
            for j in range(self.num_layers):
                out[f"{i}.{j}.linear.weight"] = self.weight[i, j].detach()
                out[f"{i}.{j}.linear.bias"] = self.bias[i, j].detach()
            if self.projections is not None:
                out[f"{i}.{self.num_layers}.weight"] = self.projections[i].detach()
        return out


def _input_dtype(module: nn.Module, fallback: torch.dtype) -> torch.dtype:
    weight = getattr(module, "weight", None)
    return weight.dtype if isinstance(weight, Tensor) and weight.is_floating_point() else fallback


# ------------------------------------------------------------------------------------------------ loading
def shipped_heads_dir(target_name: str) -> Path | None:
    """The packaged heads for a target (an alias, or the folder an alias was converted into), or None."""
    from specdec.drafters.heads.draft_folder import alias_of

    alias = alias_of(target_name)
    if alias is None:
        return None
    folder = ASSETS_DIR / alias
    return folder if (folder / CONFIG_FILE).is_file() and (folder / SAFETENSORS_FILE).is_file() else None


def load_heads(path: str | Path, hidden_size: int, vocab_size: int, lm_head: nn.Module | None,
               device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> MedusaHeads:
    """Read a Medusa folder (or its weights file) and check it against the target's hidden and vocab size."""
    weights_path = _weights_file(Path(path).expanduser())
    tensors = _read_tensors(weights_path)
    num_heads, num_layers = _head_counts(weights_path, tensors)
    where = str(weights_path)
    expected = {}
    for i in range(num_heads):
        for j in range(num_layers):
            expected[f"{i}.{j}.linear.weight"] = (hidden_size, hidden_size)
            expected[f"{i}.{j}.linear.bias"] = (hidden_size,)
    proj_keys = [f"{i}.{num_layers}.weight" for i in range(num_heads)]
    present = [k for k in proj_keys if k in tensors]
    if present and len(present) != num_heads:
        raise ModelLoadError(f"{where}: only some heads have a projection ({', '.join(present)}); "
                             "a checkpoint needs all of them or none")
    expected.update({k: (vocab_size, hidden_size) for k in present})
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ModelLoadError(f"{where} lacks {_few(missing)} (for {num_heads} heads x {num_layers} layers); "
                             "the file is incomplete or medusa_num_heads/medusa_num_layers are wrong")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise ModelLoadError(f"{where} has unexpected tensors {_few(unexpected)} for {num_heads} heads x "
                             f"{num_layers} layers; check medusa_num_heads/medusa_num_layers in config.json")
    for key, shape in expected.items():
        got = tuple(tensors[key].shape)
        if got != shape:
            what = "vocabulary x hidden size" if len(shape) == 2 and shape[0] == vocab_size else "hidden size"
            raise ModelLoadError(f"{where}: {key} has shape {got}, but the target needs {shape} ({what} "
                                 f"{hidden_size if what == 'hidden size' else (vocab_size, hidden_size)}); "
                                 "these heads were trained for another model")
    projections = None
    if present:
        projections = torch.stack([tensors[k] for k in proj_keys]).to(device, dtype)
        if _same_as(projections, lm_head):
            projections = None  # identical to the target's head: share it (less memory, int8 applies)
    if projections is None and lm_head is None:
        raise ModelLoadError(f"{where} has no projections and no target LM head was given")
    heads = MedusaHeads(num_heads, num_layers, hidden_size, vocab_size, lm_head, projections)
    with torch.no_grad():
        heads.weight.copy_(torch.stack([torch.stack([tensors[f"{i}.{j}.linear.weight"] for j in range(num_layers)])
                                        for i in range(num_heads)]))
        heads.bias.copy_(torch.stack([torch.stack([tensors[f"{i}.{j}.linear.bias"] for j in range(num_layers)])
                                      for i in range(num_heads)]))
    heads.weight.requires_grad_(False)
    heads.bias.requires_grad_(False)
    return heads.to(device, dtype).eval()


def _weights_file(path: Path) -> Path:
    if path.is_file():
        return path
    if not path.is_dir():
        raise ModelLoadError(f"no Medusa heads at {path}: give a folder holding {SAFETENSORS_FILE} or {PT_FILE}")
    for name in (SAFETENSORS_FILE, PT_FILE):
        if (path / name).is_file():
            return path / name
    raise ModelLoadError(f"{path} holds no Medusa weights: expected {SAFETENSORS_FILE} or {PT_FILE}")


def _read_tensors(path: Path) -> dict[str, Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as handle:
                raw = {key: handle.get_tensor(key) for key in handle.keys()}
        else:
            raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ModelLoadError(f"cannot read Medusa weights {path}: {exc}") from None
    if not isinstance(raw, dict) or not all(isinstance(v, Tensor) for v in raw.values()):
        raise ModelLoadError(f"{path} is not a state dict of tensors")
    # Medusa-2 style full checkpoints prefix the head keys; keep only the heads.
    if any(k.startswith("medusa_head.") for k in raw):
        raw = {k.removeprefix("medusa_head."): v for k, v in raw.items() if k.startswith("medusa_head.")}
    return {k: v.float() for k, v in raw.items()}


def _head_counts(weights_path: Path, tensors: dict[str, Tensor]) -> tuple[int, int]:
    """(heads, layers) from config.json beside the weights; inferred from the keys when it is absent."""
    config_path = weights_path.parent / CONFIG_FILE
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text())
            heads, layers = int(config["medusa_num_heads"]), int(config["medusa_num_layers"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{config_path} must hold integer medusa_num_heads and medusa_num_layers "
                                 f"({exc!r})") from None
    else:
        heads = len({k.split(".")[0] for k in tensors if k.split(".")[0].isdigit()})
        layers = len({k.split(".")[1] for k in tensors if k.endswith(".linear.weight")})
    if heads < 1 or layers < 1:
        raise ModelLoadError(f"{weights_path}: need at least one head and one layer, got {heads} heads, "
                             f"{layers} layers")
    return heads, layers


def _same_as(projections: Tensor, lm_head: nn.Module | None) -> bool:
    weight = getattr(lm_head, "weight", None)
    if not isinstance(weight, Tensor) or not weight.is_floating_point() or weight.shape != projections.shape[1:]:
        return False
    w = weight.detach().to(projections.device, projections.dtype)
    return all(torch.equal(p, w) for p in projections)


def _few(keys: list[str]) -> str:
    return ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


# ------------------------------------------------------------------------------------------------ writing
def save_heads(heads: MedusaHeads, folder: Path, meta: dict[str, Any] | None = None,
               dtype: torch.dtype = torch.bfloat16, projection: Tensor | None = None, pt: bool = False) -> Path:
    """Write `config.json` + `medusa_lm_head.safetensors` (or `.pt`). `projection [V, H]` (the target's LM head)
    is copied into every head's `{i}.{L}.weight`: the published layout, readable by Medusa's own code."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = heads.state_tensors()
    if projection is not None and heads.projections is None:
        for i in range(heads.num_heads):
            tensors[f"{i}.{heads.num_layers}.weight"] = projection.detach()
    tensors = {k: t.to("cpu", dtype).contiguous() for k, t in tensors.items()}
    if pt:
        path = folder / PT_FILE
        torch.save(tensors, path)
    else:
        path = folder / SAFETENSORS_FILE
        save_file(tensors, str(path), metadata={"format": "pt"})
    config = {"medusa_num_heads": heads.num_heads, "medusa_num_layers": heads.num_layers,
              "hidden_size": heads.hidden_size, "vocab_size": heads.vocab_size, **(meta or {})}
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return path
