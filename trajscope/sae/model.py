"""Sparse autoencoders (SAEs) over one layer's residual stream.

An SAE rewrites an activation ``x ∈ R^{d_in}`` as a sparse, non-negative code
``f ∈ R^{d_sae}`` (the *features*) and a reconstruction ``x̂ = f W_dec + b_dec``.
The encoder is the one SAELens uses (``sae_lens/saes/standard_sae.py`` and
``topk_sae.py``)::

    x' = normalise(x) - b_dec * apply_b_dec_to_input
    h  = x' W_enc + b_enc                      # pre-activations [n, d_sae]
    f  = ReLU(h)                               # architecture "standard" (trained with an L1 penalty)
    f  = ReLU(TopK_k(h)), the rest zero        # architecture "topk" (exactly ≤ k active)
    x̂  = denormalise(f W_dec + b_dec)

``W_enc`` is ``[d_in, d_sae]`` and ``W_dec`` is ``[d_sae, d_in]``, one decoder row
per feature. The parameter names, shapes and config keys are SAELens' so that
:mod:`trajscope.sae.io` can read and write its on-disk format unchanged.

Input normalisation follows SAELens' ``normalize_activations``: ``"none"``,
``"constant_norm_rescale"`` (scale each row to norm √d_in, undo on the way out),
``"layer_norm"`` (centre and divide by the std per row, undo on the way out) and
``"expected_average_only_in"``, which SAELens' ``load_from_disk`` runs as the
identity (the scaling factor is folded into the weights before saving), so it
is the identity here too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

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


class SAE(nn.Module):
    """A sparse autoencoder with SAELens-compatible parameters ``W_enc, b_enc, W_dec, b_dec``.

    Args:
        cfg: an :class:`SAEConfig`.
        seed: initialisation seed (``W_dec`` rows Kaiming-uniform, ``W_enc = W_dec.T``, biases 0, as SAELens).

    Use :meth:`load` / :meth:`save` for the SAELens on-disk format.
    """

    def __init__(self, cfg: SAEConfig, seed: int | None = 0):
        super().__init__()
        self.cfg = cfg
        dtype = DTYPES[cfg.dtype]
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        w_dec = torch.empty(cfg.d_sae, cfg.d_in, dtype=dtype)
        bound = (6.0 / cfg.d_in) ** 0.5  # kaiming_uniform_ with a=0 on a [d_sae, d_in] matrix: fan_in = d_in
        w_dec.uniform_(-bound, bound, generator=gen)
        self.W_dec = nn.Parameter(w_dec)
        self.W_enc = nn.Parameter(w_dec.T.clone().contiguous())
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae, dtype=dtype))
        self.b_dec = nn.Parameter(torch.zeros(cfg.d_in, dtype=dtype))

    # -- the public surface ------------------------------------------------------------
    @classmethod
    def load(cls, path: str, device: str | None = None) -> "SAE":
        """Read an SAE from a SAELens-format directory (``cfg.json`` + ``sae_weights.safetensors``)."""
        from trajscope.sae.io import load_sae

        return load_sae(path, device=device)

    def save(self, path: str) -> str:
        """Write this SAE as a SAELens-format directory; returns the path."""
        from trajscope.sae.io import save_sae

        return str(save_sae(self, path))

    @property
    def d_in(self) -> int:
        return self.cfg.d_in

    @property
    def d_sae(self) -> int:
        return self.cfg.d_sae

    def check_input(self, x: torch.Tensor, layer: int | None = None) -> None:
        """Raise :class:`TrajscopeError` unless ``x`` is ``[..., d_in]`` (and, when given, ``layer`` matches)."""
        if x.shape[-1] != self.cfg.d_in:
            where = f" of layer {layer}" if layer is not None else ""
            raise TrajscopeError(f"This SAE reads {self.cfg.d_in}-wide activations but the activations{where} are "
                                 f"{x.shape[-1]}-wide; use an SAE trained for this model.")
        if layer is not None and self.cfg.layer is not None and self.cfg.layer != layer:
            raise TrajscopeError(f"This SAE was trained on layer {self.cfg.layer} ({self.cfg.hook_name}), "
                                 f"not layer {layer}.")

    def pre_acts(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-activations ``h = x' W_enc + b_enc``: ``[..., d_in] → [..., d_sae]``."""
        self.check_input(x)
        x = x.to(self.W_enc.dtype)
        x = self._norm_in(x)
        x = x - self.b_dec * float(self.cfg.apply_b_dec_to_input)
        h = x @ self.W_enc + self.b_enc
        if self.cfg.architecture == "topk" and self.cfg.rescale_acts_by_decoder_norm:
            h = h * self.W_dec.norm(dim=-1)
        return h

    def activate(self, h: torch.Tensor) -> torch.Tensor:
        """The architecture's nonlinearity on pre-activations ``[..., d_sae]``."""
        if self.cfg.architecture == "topk":
            vals, idx = torch.topk(h, k=int(self.cfg.k), dim=-1, sorted=False)
            return torch.zeros_like(h).scatter_(-1, idx, vals.relu())
        return torch.relu(h)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Feature activations: ``[..., d_in] → [..., d_sae]`` (non-negative, sparse)."""
        return self.activate(self.pre_acts(x))

    def decode(self, f: torch.Tensor) -> torch.Tensor:
        """Reconstruction: ``[..., d_sae] → [..., d_in]``."""
        if f.shape[-1] != self.cfg.d_sae:
            raise TrajscopeError(f"This SAE has {self.cfg.d_sae} features but got a {f.shape[-1]}-wide code.")
        f = f.to(self.W_dec.dtype)
        if self.cfg.architecture == "topk" and self.cfg.rescale_acts_by_decoder_norm:
            f = f / self.W_dec.norm(dim=-1)
        return self._norm_out(f @ self.W_dec + self.b_dec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Reconstruction ``x̂ = decode(encode(x))``: ``[..., d_in] → [..., d_in]``."""
        return self.decode(self.encode(x))

    # -- normalisation (per call; the statistics of the input undo the output) -----------
    def _norm_in(self, x: torch.Tensor) -> torch.Tensor:
        mode = self.cfg.normalize_activations
        if mode == "constant_norm_rescale":
            self._coeff = (self.cfg.d_in ** 0.5) / x.norm(dim=-1, keepdim=True)
            return x * self._coeff
        if mode == "layer_norm":
            mu = x.mean(dim=-1, keepdim=True)
            std = (x - mu).std(dim=-1, keepdim=True)
            self._ln = (mu, std)
            return (x - mu) / (std + 1e-5)
        return x

    def _norm_out(self, x: torch.Tensor) -> torch.Tensor:
        mode = self.cfg.normalize_activations
        if mode == "constant_norm_rescale" and hasattr(self, "_coeff"):
            return x / self._coeff
        if mode == "layer_norm" and hasattr(self, "_ln"):
            mu, std = self._ln
            return x * std + mu
        return x

    @torch.no_grad()
    def fold_scale(self, scale: float) -> None:
        """Fold an input scaling ``x → scale·x`` used in training into the weights (SAELens'
        ``fold_activation_norm_scaling_factor``), so the SAE then reads unscaled activations."""
        self.W_enc.mul_(scale)
        self.W_dec.div_(scale)
        self.b_dec.div_(scale)

    def __repr__(self) -> str:
        k = f", k={self.cfg.k}" if self.cfg.architecture == "topk" else ""
        return f"SAE({self.cfg.architecture}, d_in={self.cfg.d_in}, d_sae={self.cfg.d_sae}{k}, hook={self.cfg.hook_name})"


@torch.no_grad()
def sae_features(sae: SAE, resid: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
    """Top-k active features and reconstruction error of a few residual rows (for capture).

    Pure torch, cheap enough to call inside a capture loop on the step's new rows.

    Args:
        sae: the SAE.
        resid: ``[q, d_in]`` block outputs at ``q`` positions (one row per decode step).
        k: features kept per row (ties broken by index; inactive slots have value 0).

    Returns:
        ``feature`` ``[q, k]`` int64 indices and ``value`` ``[q, k]`` float32 activations
        (descending), ``l0`` ``[q]`` int64 (active features), ``sq_err`` ``[q]`` ‖x − x̂‖²,
        ``sq_norm`` ``[q]`` ‖x‖², ``cos`` ``[q]`` cosine(x, x̂).
    """
    x = resid.to(sae.W_enc.dtype)
    f = sae.encode(x)
    x_hat = sae.decode(f)
    kk = min(int(k), f.shape[-1])
    value, feature = torch.topk(f, kk, dim=-1, sorted=True)
    err = x - x_hat
    return {
        "feature": feature.to(torch.int64), "value": value.float(),
        "l0": (f > 0).sum(-1).to(torch.int64),
        "sq_err": err.pow(2).sum(-1).float(), "sq_norm": x.pow(2).sum(-1).float(),
        "cos": torch.nn.functional.cosine_similarity(x, x_hat, dim=-1).float(),
    }
