"""The prefill→decode SAE drift report: reconstruction and feature overlap, several SAEs side by side.

:func:`reconstruction_report` encodes a harvest (usually the ``eval`` prompts, never seen
in SAE training) with each SAE, computes the spliced-in KL / CE increase per row
(:mod:`trajscope.sae.splice`), and hands the tensors to the pure metric
functions of :mod:`trajscope.metrics.sae_eval` (reconstruction by depth and
entropy band, prefill as the reference row) and :mod:`trajscope.metrics.overlap`
(prefill vs decode feature sets, overall and per depth band).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import polars as pl
import torch

from trajscope.metrics import overlap as ov
from trajscope.metrics import sae_eval as ev
from trajscope.sae.harvest import Harvest
from trajscope.sae.model import SAE
from trajscope.sae.splice import splice_rows


@torch.no_grad()
def encode_all(sae: SAE, acts: torch.Tensor, batch: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_hat [N, d], f [N, d_sae])`` for ``acts [N, d]``, in batches."""
    xs, fs = [], []
    for i in range(0, acts.shape[0], batch):
        x_hat, f = sae.reconstruct(acts[i:i + batch])
        fs.append(f)
        xs.append(x_hat)
    return torch.cat(xs), torch.cat(fs)


def reconstruction_report(harvest: Harvest, saes: Mapping[str, SAE], *, model: Any = None, overlap_k: int = 64,
                 min_count: int = 5, progress: Callable[[str, int, int], None] | None = None
                 ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Reconstruction drift and feature overlap of several SAEs on one harvest.

    Args:
        harvest: activations and tags (``Harvest.rows``) at one layer.
        saes: name → SAE; each must read ``harvest.acts``' width (checked, one clear error otherwise).
        model: a ``ModelHandle`` for the spliced-in KL / CE increase (skipped when None).
        overlap_k: top-k-by-frequency set size for the Jaccard overlap.
        min_count: activations for a feature to count as appearing / vanishing.
        progress: optional ``(sae name, done, total)`` callback during splicing.

    Returns:
        ``(reconstruction, overlap)``: the long frame of :func:`trajscope.metrics.sae_eval.reconstruction_table`
        and one row per (SAE, decode group) of :func:`trajscope.metrics.overlap.overlap_summary`.
    """
    recons, splices, overlaps = {}, {}, []
    rows = harvest.rows
    pre_mask = torch.from_numpy((rows["phase"] == "prefill").to_numpy())
    groups = [("decode", rows["phase"] == "decode")]
    groups += [(f"steps {b}", rows["depth_band"] == b) for b in
               [ev.depth_band(lo) for lo, _ in ev.DEPTH_BANDS] if (rows["depth_band"] == b).any()]
    for name, sae in saes.items():
        sae.check_input(harvest.acts, harvest.layer)
        x_hat, f = encode_all(sae, harvest.acts)
        recons[name] = (x_hat, f)
        if model is not None:
            cb = (lambda d, t, name=name: progress(name, d, t)) if progress is not None else None
            splices[name] = splice_rows(model, harvest.sequences, rows, harvest.layer, sae, progress=cb)
        for label, mask in groups:
            m = torch.from_numpy(mask.fill_null(False).to_numpy())
            overlaps.append({"sae": name, "decode_group": label,
                             **ov.overlap_summary(f[pre_mask], f[m], k=overlap_k, min_count=min_count)})
    table = ev.reconstruction_table(rows, harvest.acts, recons, splices or None)
    return table, pl.DataFrame(overlaps)
