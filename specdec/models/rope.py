"""Rotary position embeddings, with the linear and llama3 frequency scalings.

cos/sin are precomputed once for every position the model serves and indexed by each token's position,
so a token's rotation depends only on its own position: tree nodes at depth d get position prefix + d.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from specdec.models.config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> Tensor:
    """Per-pair rotation frequencies `[head_dim // 2]` in float64, scaled as the config asks."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = config.rope_scaling
    kind = scaling.get("rope_type", "default")
    if kind == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif kind == "llama3":
        inv_freq = _llama3_scale(inv_freq, scaling)
    return inv_freq


def _llama3_scale(inv_freq: Tensor, scaling: dict) -> Tensor:
    """Llama 3.1's piecewise scaling: long wavelengths divided by `factor`, short kept, a smooth ramp between."""
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    original = float(scaling.get("original_max_position_embeddings", 8192))
    wavelength = 2 * math.pi / inv_freq
    smooth = (original / wavelength - low) / (high - low)
    ramp = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    is_medium = (wavelength <= original / low) & (wavelength >= original / high)
    return torch.where(is_medium, ramp, scaled)


class RotaryEmbedding(torch.nn.Module):
    """Holds cos/sin tables `[max_position, head_dim]` and rotates q and k in place of HF's per-call math."""

    def __init__(self, config: ModelConfig, device: torch.device | str = "cpu") -> None:
        super().__init__()
        inv_freq = inverse_frequencies(config)
        positions = torch.arange(config.max_position, dtype=torch.float64)
        angles = torch.outer(positions, inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos().float().to(device), persistent=False)
        self.register_buffer("sin", angles.sin().float().to(device), persistent=False)

    def forward(self, positions: Tensor, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """q `[T, Hq, D]`, k `[T, Hkv, D]` rotated by each token's position."""
        cos = self.cos[positions].unsqueeze(1).to(q.dtype)
        sin = self.sin[positions].unsqueeze(1).to(q.dtype)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
