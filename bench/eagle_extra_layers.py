"""Capacity probe: does an EAGLE-1/2 head with more llama layers learn to agree with the target better?

    python bench/eagle_extra_layers.py --run-json /work/runs/eagle-own/run.json --out /work/runs/eagle-scratch2 \
        --extra-layers 1 --steps 200 --lr 0.001 --from-scratch --seed 6

The package's predictor is one layer (EAGLE's choice, ours since the first head). This wraps the trainer, for
this process only, so that the predictor gets `--extra-layers` more llama layers after its own (the same layer
body; each a residual branch whose output projections start at zero, so that a fine-tuned head starts where the
one-layer head was), each with its own teacher-forced attention (`DenseAttention`, the unrolled passes
included). Everything else is `specdec train eagle`'s run as the given run.json describes it: corpus, loss,
`--unroll`, batches. Point `--out` at a folder holding that run's `features/` (hard links are enough) and the
recorded target features are reused. The held-out top-1 agreement of the run's checkpoints is the result;
`--extra-layers 0` is the one-layer control with the same seed, batches and initialisation of the first layer.
The drafter does not run such a head (it would need a cache and a fast path per layer): this only says whether
it would be worth it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specdec.training.eagle as trainer  # noqa: E402
from specdec.drafters.heads.eagle_model import EaglePredictor  # noqa: E402
from specdec.models.llama import MLP, RMSNorm  # noqa: E402

EXTRA_LAYERS = 1  # set from --extra-layers before the trainer builds anything
ONE_LAYER_ATTENTION = trainer.DenseAttention


class LayeredAttention:
    """One teacher-forced attention per layer (each keeps its own unrolled keys); the first layer's is called
    as the trainer's own, the extra layers' through `parts`."""

    def __init__(self, batch: int, length: int, config) -> None:
        self.parts = [ONE_LAYER_ATTENTION(batch, length, config) for _ in range(EXTRA_LAYERS + 1)]

    def __call__(self, q, k, v):
        return self.parts[0](q, k, v)


class ExtraLayer(nn.Module):
    def __init__(self, c) -> None:
        super().__init__()
        h = c.hidden_size
        self.input_layernorm = RMSNorm(h, c.rms_eps)
        self.qkv_proj = nn.Linear(h, c.q_size + 2 * c.kv_size, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.q_size, h, bias=False)
        self.post_attention_layernorm = RMSNorm(h, c.rms_eps)
        self.mlp = MLP(c)
        nn.init.normal_(self.qkv_proj.weight, std=0.02)
        nn.init.normal_(self.mlp.gate_up_proj.weight, std=0.02)
        nn.init.zeros_(self.o_proj.weight)
        nn.init.zeros_(self.mlp.down_proj.weight)


class LayeredPredictor(EaglePredictor):
    def __init__(self, config, device="cpu") -> None:
        super().__init__(config, device)
        self.extra = nn.ModuleList([ExtraLayer(config.layer) for _ in range(EXTRA_LAYERS)])

    def forward(self, embeds, features, positions, attend):
        x = super().forward(embeds, features, positions, attend)
        c = self.config.layer
        for i, layer in enumerate(self.extra):
            q, k, v = layer.qkv_proj(layer.input_layernorm(x)).split([c.q_size, c.kv_size, c.kv_size], dim=-1)
            q, k = self.rope(positions, q.reshape(-1, c.num_heads, c.head_dim),
                             k.reshape(-1, c.num_kv_heads, c.head_dim))
            x = x + layer.o_proj(attend.parts[i + 1](q, k, v.reshape(-1, c.num_kv_heads, c.head_dim)))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x


ONE_LAYER_INIT = trainer.init_predictor


def init_predictor(target, version, draft_ids=None, seed=0):
    """The trainer's one-layer initialisation, copied into a layered predictor (extra layers seeded after it)."""
    base = ONE_LAYER_INIT(target, version, draft_ids, seed)
    torch.manual_seed(seed)
    model = LayeredPredictor(base.config, target.device).to(target.device, torch.float32)
    model.load_state_dict(base.state_dict(), strict=False)
    return model


def start_from(model, folder, target) -> None:
    """A one-layer checkpoint into the first layer; the extra layers keep their (identity) initialisation."""
    from specdec.drafters.heads.eagle_checkpoint import load_eagle

    trained, _ = load_eagle(folder, target.config, target.device, torch.float32)
    model.load_state_dict(trained.state_dict(), strict=False)


def main() -> None:
    global EXTRA_LAYERS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-json", type=Path, required=True, help="a `specdec train eagle` run's settings")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--extra-layers", type=int, default=1)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--from-scratch", action="store_true", help="ignore the run's --init-from")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    EXTRA_LAYERS = args.extra_layers
    trainer.init_predictor, trainer.start_from, trainer.DenseAttention = init_predictor, start_from, LayeredAttention
    saved = json.loads(args.run_json.read_text())
    saved.update(steps=args.steps, lr=args.lr)
    if args.seed is not None:
        saved["seed"] = args.seed
    if args.from_scratch:
        saved["init_from"] = None
    torch.set_num_threads(args.threads)

    def progress(stage: str, done: int, total: int, fields: dict) -> None:
        if done % 25 == 0 or done == total:
            print(stage, done, total, {k: round(v, 4) for k, v in fields.items() if isinstance(v, float)}, flush=True)

    trainer.run_eagle_training(trainer.EagleTrainConfig(**saved), args.out, resume=True, progress=progress)
    for row in torch.load(args.out / trainer.CHECKPOINT_FILE, weights_only=False)["state"]["history"]:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
