"""Feature index: what each SAE feature responds to, prefill and decode alike.

A feature id alone says nothing. Neuronpedia's answer is a page per feature with
its *max-activating examples*: the contexts, over a fixed corpus, where the
feature fires hardest, each with the activating token marked. This module builds
the same over a prompt set (by default the shipped held-out code prompts): each
prompt is captured with a greedy continuation, so the index sees both phases,
the SAE encodes every position's residual at its layer, and per feature it keeps

- the ``top_n`` positions with the highest activation (prompt id, ``pos``,
  ``step``, ``phase``, the activating token, up to ``context`` tokens left of it
  and a few right of it, the value), and
- its *density*, the fraction of positions where it is active (> 0), counted
  separately over prefill and decode positions, so a feature that lives only in
  one phase shows it.

Files, in the SAE directory (:data:`EXAMPLES_FILE`, :data:`DENSITY_FILE`,
:data:`INFO_FILE`): two long Parquet tables (one row per feature × rank, one row
per feature) and a JSON of how the index was built. ``trajscope sae-index``
rebuilds them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Callable, Sequence

import numpy as np
import polars as pl
import torch

from trajscope import positions
from trajscope.errors import TrajscopeError
from trajscope.io import atomic_file, atomic_write_text
from trajscope.trajectory import write_table

EXAMPLES_FILE = "feature_index.parquet"
DENSITY_FILE = "feature_density.parquet"
INFO_FILE = "feature_index.json"
RIGHT_CONTEXT = 4


@dataclasses.dataclass(frozen=True)
class IndexSettings:
    """How an index is built: which prompts, how long each continuation, how much is kept."""

    prompts: str = "sample_data/prompts/heldout_code.jsonl"
    split: str = "all"
    n_prompts: int = 0
    max_new_tokens: int = 64
    top_n: int = 8
    context: int = 12

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "IndexSettings":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclasses.dataclass
class FeatureIndex:
    """Top-activating examples and prefill/decode density of every feature of one SAE.

    Attributes:
        examples: one row per (feature, rank): ``feature, rank, value, prompt_id, pos, step, phase, token,
            left`` (list of up to ``context`` token texts before ``pos``), ``right`` (a few after).
        density: one row per feature: ``feature, active_prefill, active_decode, n_prefill, n_decode,
            density_prefill, density_decode``.
        info: how it was built (:class:`IndexSettings` fields plus the SAE, model and counts).
    """

    examples: pl.DataFrame
    density: pl.DataFrame
    info: dict

    def contexts(self, feature: int) -> pl.DataFrame:
        """The examples of ``feature``, strongest first (empty when it never fired)."""
        return self.examples.filter(pl.col("feature") == int(feature)).sort("rank")

    def density_of(self, feature: int) -> dict | None:
        """The density row of ``feature`` as a dict, or None if the index does not know it."""
        row = self.density.filter(pl.col("feature") == int(feature))
        return row.row(0, named=True) if len(row) else None

    def save(self, directory: str | os.PathLike) -> pathlib.Path:
        """Write the three files into ``directory`` (each atomically); returns the directory."""
        d = pathlib.Path(directory)
        for df, name in ((self.examples, EXAMPLES_FILE), (self.density, DENSITY_FILE)):
            with atomic_file(d / name) as tmp:
                write_table(df, tmp, table=pathlib.Path(name).stem)
        atomic_write_text(d / INFO_FILE, json.dumps(self.info, indent=1))
        return d

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "FeatureIndex | None":
        """The index saved in ``directory``, or None when it has none."""
        d = pathlib.Path(directory)
        if not (d / EXAMPLES_FILE).is_file() or not (d / DENSITY_FILE).is_file():
            return None
        info = json.loads((d / INFO_FILE).read_text(encoding="utf-8")) if (d / INFO_FILE).is_file() else {}
        return cls(pl.read_parquet(d / EXAMPLES_FILE), pl.read_parquet(d / DENSITY_FILE), info)


def density_table(active: torch.Tensor, is_decode: np.ndarray) -> pl.DataFrame:
    """Per-feature activation density by phase.

    Args:
        active: ``[n, d_sae]`` bool, feature active at each position.
        is_decode: ``[n]`` bool, the position is a decode position.

    Returns:
        One row per feature (``d_sae`` rows); a phase with no positions has density null.
    """
    dec = torch.as_tensor(is_decode, dtype=torch.bool)
    a_pre = active[~dec].sum(0).numpy().astype(np.int64)
    a_dec = active[dec].sum(0).numpy().astype(np.int64)
    n_pre, n_dec = int((~dec).sum()), int(dec.sum())
    return pl.DataFrame({
        "feature": np.arange(active.shape[1], dtype=np.int32), "active_prefill": a_pre, "active_decode": a_dec,
        "n_prefill": np.full(active.shape[1], n_pre), "n_decode": np.full(active.shape[1], n_dec),
        "density_prefill": a_pre / n_pre if n_pre else np.full(active.shape[1], None),
        "density_decode": a_dec / n_dec if n_dec else np.full(active.shape[1], None),
    }).with_columns(pl.col("density_prefill", "density_decode").cast(pl.Float64))


def top_rows(f: torch.Tensor, top_n: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``top_n`` rows of highest activation per feature.

    Args:
        f: ``[n, d_sae]`` feature activations.

    Returns:
        ``(values, rows)``, both ``[d_sae, min(top_n, n)]``, strongest first (ties: lower row first).
    """
    k = min(int(top_n), f.shape[0])
    vals, rows = torch.topk(f.T, k, dim=1, sorted=True)
    return vals.numpy(), rows.numpy()


def _tokens_of(traj) -> list[str]:
    return traj.tokens.sort("pos")["text"].fill_null("").to_list()


def examples_table(f: torch.Tensor, where: pl.DataFrame, texts: list[list[str]], top_n: int,
                   context: int) -> pl.DataFrame:
    """Top-activating examples of every feature.

    Args:
        f: ``[n, d_sae]`` activations of all positions of all prompts, stacked.
        where: ``n`` rows ``run, prompt_id, pos, prompt_len`` naming each row of ``f``.
        texts: per run, the token texts by position.

    Returns:
        The :attr:`FeatureIndex.examples` table (active examples only).
    """
    vals, rows = top_rows(f, top_n)
    feat = np.repeat(np.arange(vals.shape[0]), vals.shape[1])
    rank = np.tile(np.arange(vals.shape[1]), vals.shape[0])
    v, r = vals.reshape(-1), rows.reshape(-1)
    keep = v > 0
    feat, rank, v, r = feat[keep], rank[keep], v[keep], r[keep]
    w = where[r]
    pos, plen, run = w["pos"].to_numpy(), w["prompt_len"].to_numpy(), w["run"].to_numpy()
    toks = [texts[i][p] for i, p in zip(run, pos)]
    left = [texts[i][max(0, p - context):p] for i, p in zip(run, pos)]
    right = [texts[i][p + 1:p + 1 + RIGHT_CONTEXT] for i, p in zip(run, pos)]
    steps = np.array([positions.query_step(int(p), int(n)) for p, n in zip(pos, plen)], dtype=np.int32)
    phase = [positions.phase(int(p), int(n)) for p, n in zip(pos, plen)]
    return pl.DataFrame({
        "feature": feat.astype(np.int32), "rank": rank.astype(np.int8), "value": v.astype(np.float32),
        "prompt_id": w["prompt_id"], "pos": pos.astype(np.int32), "step": steps, "phase": phase, "token": toks,
        "left": left, "right": right}, schema_overrides={"left": pl.List(pl.String), "right": pl.List(pl.String)})


def encode_positions(traj, sae) -> torch.Tensor:
    """``[n_positions_computed, d_sae]`` activations of a run's residuals at the SAE's layer."""
    x = traj.residual(sae.cfg.layer).float()
    sae.check_input(x, sae.cfg.layer)
    with torch.no_grad():
        return sae.encode(x).float()


def build_index(model, sae, items: Sequence[dict], settings: IndexSettings | None = None,
                on_progress: Callable[[int, int], None] | None = None) -> FeatureIndex:
    """Capture each prompt with a greedy continuation, encode every position, keep the top examples and densities.

    Args:
        model: a :class:`~trajscope.model.ModelHandle` (the SAE's model).
        sae: an SAE with a layer (``sae.cfg.layer``).
        items: prompts, ``{"prompt": str, "id": ...}`` (as :func:`trajscope.prompts.read_prompts` gives).
        settings: an :class:`IndexSettings` (its ``prompts``/``split`` are recorded, not read).
        on_progress: called ``(done, total)`` after each prompt.

    Returns:
        A :class:`FeatureIndex` over all positions (prefill and decode) of all prompts.
    """
    from trajscope.capture import capture

    s = settings or IndexSettings()
    if sae.cfg.layer is None:
        raise TrajscopeError("This SAE names no layer (hook_name), so the index cannot know which residuals to encode.")
    feats, where, texts, total = [], [], [], len(items)
    for i, item in enumerate(items):
        traj = capture(model, item["prompt"], max_new_tokens=s.max_new_tokens, residual_layers=[sae.cfg.layer])
        f = encode_positions(traj, sae)
        feats.append(f)
        where.append(pl.DataFrame({"run": np.full(f.shape[0], i), "prompt_id": str(item.get("id", i)),
                                   "pos": np.arange(f.shape[0]), "prompt_len": traj.prompt_len}))
        texts.append(_tokens_of(traj))
        if on_progress:
            on_progress(i + 1, total)
    f, where = torch.cat(feats), pl.concat(where)
    is_dec = where["pos"].to_numpy() >= where["prompt_len"].to_numpy()
    density = density_table(f > 0, is_dec)
    examples = examples_table(f, where, texts, s.top_n, s.context)
    meta = dict(sae.cfg.metadata)
    info = {**s.to_dict(), "n_prompts": total, "sae_layer": sae.cfg.layer, "sae_hook": sae.cfg.hook_name,
            "model_name": meta.get("model_name"), "model_revision": model.revision(),
            "n_positions": int(f.shape[0]), "n_prefill": int((~is_dec).sum()), "n_decode": int(is_dec.sum()),
            "greedy": True, "built_with": "trajscope sae-index"}
    return FeatureIndex(examples, density, info)
