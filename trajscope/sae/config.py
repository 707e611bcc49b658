"""SAEConfig: the shape and behaviour of an SAE, as SAELens' ``cfg.json`` describes it.

Kept apart from :mod:`trajscope.sae.model` so that the on-disk format
(:mod:`trajscope.sae.io`) reads and writes configs without importing the model.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from trajscope.errors import TrajscopeError

ARCHITECTURES = ("standard", "topk")
NORMALIZATIONS = ("none", "expected_average_only_in", "constant_norm_rescale", "layer_norm")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class SAEConfig:
    """Shape and behaviour of an SAE (the SAELens ``cfg.json`` fields trajscope uses).

    Attributes:
        architecture: ``"standard"`` (ReLU, trained with L1) or ``"topk"``.
        d_in: width of the activations it reads (the model's ``d_model``).
        d_sae: number of features.
        k: active features per row for ``"topk"`` (ignored for ``"standard"``).
        apply_b_dec_to_input: subtract ``b_dec`` from the input before encoding.
        normalize_activations: one of :data:`NORMALIZATIONS`.
        rescale_acts_by_decoder_norm: SAELens TopK option (pre-activations × ‖W_dec row‖).
        hook_name: where it reads, TransformerLens style (``blocks.{l}.hook_resid_post``).
        dtype, device: as SAELens stores them.
        metadata: everything else (model name, training settings); round-tripped.
    """

    architecture: str
    d_in: int
    d_sae: int
    k: int | None = None
    apply_b_dec_to_input: bool = True
    normalize_activations: str = "none"
    rescale_acts_by_decoder_norm: bool = False
    hook_name: str | None = None
    dtype: str = "float32"
    device: str = "cpu"
    metadata: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.architecture not in ARCHITECTURES:
            raise TrajscopeError(f"Unknown SAE architecture '{self.architecture}'; trajscope reads "
                                 f"{', '.join(repr(a) for a in ARCHITECTURES)}.")
        if self.normalize_activations not in NORMALIZATIONS:
            raise TrajscopeError(f"Unknown normalize_activations '{self.normalize_activations}'; expected one of "
                                 f"{', '.join(NORMALIZATIONS)}.")
        if self.dtype not in DTYPES:
            raise TrajscopeError(f"Unknown SAE dtype '{self.dtype}'; expected one of {', '.join(DTYPES)}.")
        if int(self.d_in) <= 0 or int(self.d_sae) <= 0:
            raise TrajscopeError(f"SAE widths must be positive (d_in={self.d_in}, d_sae={self.d_sae}).")
        if self.architecture == "topk" and not (self.k and 0 < int(self.k) <= int(self.d_sae)):
            raise TrajscopeError(f"A topk SAE needs 0 < k ≤ d_sae ({self.d_sae}); got k={self.k}.")

    @property
    def layer(self) -> int | None:
        """The block index in ``hook_name`` (``blocks.3.hook_resid_post`` → 3), if any."""
        parts = (self.hook_name or "").split(".")
        if len(parts) >= 2 and parts[0] == "blocks" and parts[1].isdigit():
            return int(parts[1])
        layer = self.metadata.get("layer")
        return int(layer) if layer is not None else None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SAEConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def resid_hook_name(layer: int) -> str:
    """TransformerLens / SAELens name of block ``layer``'s output: ``blocks.{layer}.hook_resid_post``."""
    return f"blocks.{int(layer)}.hook_resid_post"
