"""Builders for tiny SAEs and synthetic activations used across tests/sae (overridable defaults)."""

from __future__ import annotations

import torch

from trajscope.sae.model import SAE, SAEConfig


def tiny_sae(architecture: str = "topk", d_in: int = 8, d_sae: int = 16, k: int = 3, seed: int = 0, **overrides) -> SAE:
    """A random SAE with non-zero biases (so bias handling is exercised)."""
    cfg = SAEConfig(architecture=architecture, d_in=d_in, d_sae=d_sae, k=k if architecture == "topk" else None,
                    hook_name=overrides.pop("hook_name", "blocks.1.hook_resid_post"), **overrides)
    sae = SAE(cfg, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        sae.b_enc.copy_(torch.randn(d_sae, generator=g) * 0.1)
        sae.b_dec.copy_(torch.randn(d_in, generator=g) * 0.1)
    return sae


def acts(n: int = 32, d: int = 8, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed)) * 2.0 + 0.5
