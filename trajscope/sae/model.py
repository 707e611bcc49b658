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

from typing import Any

import torch
from torch import nn

from trajscope.errors import TrajscopeError
from trajscope.sae.config import ARCHITECTURES, DTYPES, NORMALIZATIONS, SAEConfig, resid_hook_name  # noqa: F401
from trajscope.sae.io import load_sae, save_sae


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
        return load_sae(path, cls, device=device)

    def save(self, path: str) -> str:
        """Write this SAE as a SAELens-format directory; returns the path."""
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

    def input_stats(self, x: torch.Tensor) -> Any:
        """The per-input normalisation statistics of ``x`` that :meth:`decode` needs to undo
        ``normalize_activations`` (``constant_norm_rescale``: the scale ``[..., 1]``; ``layer_norm``:
        ``(mean, std)``); None for SAEs that do not normalise each input."""
        mode = self.cfg.normalize_activations
        x = x.to(self.W_enc.dtype)
        if mode == "constant_norm_rescale":
            return (self.cfg.d_in ** 0.5) / x.norm(dim=-1, keepdim=True)
        if mode == "layer_norm":
            mu = x.mean(dim=-1, keepdim=True)
            return mu, (x - mu).std(dim=-1, keepdim=True)
        return None

    def pre_acts(self, x: torch.Tensor, stats: Any = None) -> torch.Tensor:
        """Pre-activations ``h = x' W_enc + b_enc``: ``[..., d_in] → [..., d_sae]`` (``stats``: :meth:`input_stats`)."""
        self.check_input(x)
        x = x.to(self.W_enc.dtype)
        stats = self.input_stats(x) if stats is None else stats
        mode = self.cfg.normalize_activations
        if mode == "constant_norm_rescale":
            x = x * stats
        elif mode == "layer_norm":
            x = (x - stats[0]) / (stats[1] + 1e-5)
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

    def decode(self, f: torch.Tensor, stats: Any = None) -> torch.Tensor:
        """Reconstruction: ``[..., d_sae] → [..., d_in]``.

        For SAEs that normalise each input, pass the :meth:`input_stats` of the input that was
        encoded (or use :meth:`reconstruct`): the statistics belong to that input, never to
        whatever was encoded last.
        """
        if f.shape[-1] != self.cfg.d_sae:
            raise TrajscopeError(f"This SAE has {self.cfg.d_sae} features but got a {f.shape[-1]}-wide code.")
        self._check_stats(stats)
        f = f.to(self.W_dec.dtype)
        if self.cfg.architecture == "topk" and self.cfg.rescale_acts_by_decoder_norm:
            f = f / self.W_dec.norm(dim=-1)
        return self._denormalise(f @ self.W_dec + self.b_dec, stats)

    def decode_sparse(self, idx: torch.Tensor, vals: torch.Tensor, stats: Any = None) -> torch.Tensor:
        """:meth:`decode` of a code given by its active features: ``idx``/``vals`` ``[..., m]`` (indices
        and activations; inactive slots may carry value 0). Sums ``m`` decoder rows instead of
        multiplying by the whole ``[d_sae, d_in]`` decoder: the same reconstruction up to float
        rounding (the order of the sum), ``d_sae / m`` times less work."""
        self._check_stats(stats)
        vals = vals.to(self.W_dec.dtype)
        if self.cfg.architecture == "topk" and self.cfg.rescale_acts_by_decoder_norm:
            vals = vals / self.W_dec.norm(dim=-1)[idx]
        lead, m = idx.shape[:-1], idx.shape[-1]
        x = torch.nn.functional.embedding_bag(idx.reshape(-1, m), self.W_dec, mode="sum",
                                              per_sample_weights=vals.reshape(-1, m))
        return self._denormalise(x.reshape(*lead, self.cfg.d_in) + self.b_dec, stats)

    def _check_stats(self, stats: Any) -> None:
        """Decoding an SAE that normalises each input needs that input's statistics."""
        mode = self.cfg.normalize_activations
        if stats is None and mode in ("constant_norm_rescale", "layer_norm"):
            raise TrajscopeError(f"This SAE normalises each input ({mode}), so decoding needs that input's "
                                 "statistics: use sae.reconstruct(x), or pass stats=sae.input_stats(x).")

    def _denormalise(self, x: torch.Tensor, stats: Any) -> torch.Tensor:
        mode = self.cfg.normalize_activations
        if mode == "constant_norm_rescale":
            return x / stats
        if mode == "layer_norm":
            return x * stats[1] + stats[0]
        return x

    def reconstruct(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x̂, f)`` of ``x [..., d_in]``: the one encode-then-decode, with ``x``'s own statistics."""
        stats = self.input_stats(x)
        f = self.activate(self.pre_acts(x, stats))
        return self.decode(f, stats), f

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Reconstruction ``x̂ = decode(encode(x))``: ``[..., d_in] → [..., d_in]``."""
        return self.reconstruct(x)[0]

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
    kk = min(int(k), sae.cfg.d_sae)
    if sae.cfg.architecture == "topk" and kk <= int(sae.cfg.k):
        # TopK: the code has at most cfg.k active features, so sort those and decode them alone.
        stats = sae.input_stats(x)
        vals, idx = torch.topk(sae.pre_acts(x, stats), int(sae.cfg.k), dim=-1, sorted=True)
        vals = vals.relu()
        x_hat = sae.decode_sparse(idx, vals, stats)
        value, feature, l0 = vals[..., :kk], idx[..., :kk], (vals > 0).sum(-1)
    else:
        x_hat, f = sae.reconstruct(x)
        value, feature = torch.topk(f, kk, dim=-1, sorted=True)
        l0 = (f > 0).sum(-1)
    err = x - x_hat
    return {
        "feature": feature.to(torch.int64), "value": value.float(),
        "l0": l0.to(torch.int64),
        "sq_err": err.pow(2).sum(-1).float(), "sq_norm": x.pow(2).sum(-1).float(),
        "cos": torch.nn.functional.cosine_similarity(x, x_hat, dim=-1).float(),
    }
