"""CE loss recovered by an SAE, normalised by zero-ablation (SAEBench's "CE loss score").

Three teacher-forced forwards of the same tokens through the model boundary
(:meth:`~trajscope.model.ModelHandle.forward` with ``splice``):

- clean: the model as is;
- zero: block ``layer``'s output replaced by 0;
- spliced: block ``layer``'s output replaced by the SAE's reconstruction.

Per position the next-token cross-entropy of each, and over any set of
positions ``CE_recovered = (CE_zero − CE_spliced) / (CE_zero − CE_clean)`` with
each CE the mean over the set (1 = the SAE loses nothing, 0 = as bad as erasing
the layer).

Positions before ``first_pos`` (default 1: position 0, the attention sink, whose
residual is two orders of magnitude larger than any other on SmolLM2) are left
clean in both the zero and the spliced forward, and no CE is scored at them.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

from trajscope.errors import TrajscopeError
from trajscope.stats import Interval


def _replace_from(first_pos: int, fn):
    def splice(h: torch.Tensor) -> torch.Tensor:
        out = h.clone()
        out[:, first_pos:] = fn(h[:, first_pos:]).to(h.dtype)
        return out
    return splice


def _token_ce(logits: torch.Tensor, token_ids: Sequence[int]) -> np.ndarray:
    """``[T-1]`` CE of token t+1 given the prefix up to t."""
    lp = logits[:-1].float().log_softmax(-1)
    tgt = torch.tensor(list(token_ids[1:]), dtype=torch.long)
    return (-lp.gather(-1, tgt[:, None])[:, 0]).double().numpy()


def splice_ce(model: Any, saes: Mapping[str, Any], token_ids: Sequence[int], layer: int,
              first_pos: int = 1) -> dict[str, np.ndarray]:
    """Next-token CE at positions ``first_pos .. T-2`` under clean, zero-ablated and SAE-spliced forwards.

    Args:
        model: a :class:`~trajscope.model.ModelHandle`.
        saes: ``{name: sae}``; each SAE maps ``[..., d_in] → [..., d_in]`` (its reconstruction).
        token_ids: T tokens.
        layer: block whose output is replaced.
        first_pos: positions before it stay clean and are not scored.

    Returns:
        ``"clean"``, ``"zero"`` and one entry per SAE name: ``[T - 1 - first_pos]`` CE in nats each;
        ``"pos"``: the positions whose next token is scored.
    """
    if len(token_ids) < first_pos + 2:
        raise TrajscopeError(f"CE recovered needs at least {first_pos + 2} tokens, got {len(token_ids)}.")
    cut = slice(first_pos, None)
    with torch.no_grad():
        out = {"clean": _token_ce(model.forward(token_ids).logits, token_ids)[cut],
               "zero": _token_ce(model.forward(token_ids, splice=(layer, _replace_from(first_pos, torch.zeros_like)))
                                 .logits, token_ids)[cut]}
        for name, sae in saes.items():
            fn = _replace_from(first_pos, lambda x, sae=sae: sae(x.float()))
            out[name] = _token_ce(model.forward(token_ids, splice=(layer, fn)).logits, token_ids)[cut]
    out["pos"] = np.arange(first_pos, len(token_ids) - 1)
    return out


def ce_recovered(clean: Any, zero: Any, spliced: Any) -> float:
    """``(mean zero − mean spliced) / (mean zero − mean clean)`` over the same positions."""
    c, z, s = (float(np.mean(v)) for v in (clean, zero, spliced))
    if z - c <= 0:
        raise TrajscopeError(f"Zero-ablation does not raise the CE here ({z:.4f} vs clean {c:.4f}), so CE "
                             "recovered is undefined.")
    return (z - s) / (z - c)


def ratio_interval(num: Any, den: Any, clusters: Any, *, level: float = 0.95, n_boot: int = 1000,
                   seed: int = 0) -> Interval:
    """``Σ num / Σ den`` with a percentile interval from resampling clusters (prompts or files) with replacement.

    Rows of one cluster travel together; used for CE recovered (num = zero − spliced, den = zero − clean per
    position) and for FVU (num = ‖x − x̂‖², den = ‖x − x̄‖² per row).
    """
    n, m = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    labels, codes = np.unique(np.asarray(clusters), return_inverse=True)
    k = labels.size
    sn, sm = np.bincount(codes, n, minlength=k), np.bincount(codes, m, minlength=k)
    rng = np.random.default_rng(seed)
    draws = np.stack([np.bincount(rng.integers(0, k, k), minlength=k) for _ in range(n_boot)])  # [n_boot, k]
    tn, tm = draws @ sn, draws @ sm
    boot = np.where(tm > 0, tn / np.where(tm > 0, tm, 1), np.nan)
    boot = boot[np.isfinite(boot)]
    lo, hi = np.quantile(boot, [(1 - level) / 2, 1 - (1 - level) / 2]) if boot.size and k > 1 else (np.nan, np.nan)
    return Interval(float(n.sum() / m.sum()), float(lo), float(hi), level, int(k), n_boot)


def ce_recovered_interval(clean: Any, zero: Any, spliced: Any, clusters: Any, **kwargs: Any) -> Interval:
    """:func:`ce_recovered` with a cluster-bootstrap interval (:func:`ratio_interval`)."""
    c, z, s = (np.asarray(v, dtype=np.float64) for v in (clean, zero, spliced))
    ce_recovered(c, z, s)  # refuses an undefined ratio
    return ratio_interval(z - s, z - c, clusters, **kwargs)
