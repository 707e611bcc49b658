"""Prefix caching: which activations a cache-heavy harvest never produces, and what reuse changes.

A serving stack with prefix caching (vLLM's automatic prefix caching, SGLang's radix cache)
computes the KV of a shared prefix once and reuses it: a request whose first ``r`` tokens
are cached runs only its last ``len − r`` tokens. The residual stream at the reused
positions is never computed again, so an activation dataset harvested from such a stack
holds no rows there — typically the system prompt, few-shot header and boilerplate.

:func:`plan_reuse` decides, for a prompt set in order, how many leading tokens of each
prompt are served from the cache: the longest token prefix it shares with the warm prefix
(the set-wide shared prefix, pre-cached) or with any earlier prompt, rounded down to whole
cache blocks, and always leaving at least one token to compute (the last token's logits are
needed). :func:`coverage_map` records, per position, whether it was ``computed`` or ``reused``
with its token class and region (``shared`` prefix / ``own`` tokens).

:func:`prefix_reuse_deltas` compares each prompt's computed positions with a reused prefix
(``forward(suffix, past=prefix_cache(prefix))``) against one full recompute of the whole
sequence. Columns: ``prompt_id``, ``reused``, ``layer``, ``pos`` (absolute), ``l2``,
``rel_l2``, ``cos``, ``greedy_ref``, ``greedy``, ``greedy_diverged`` and provenance.
"""

from __future__ import annotations

from typing import Any, Sequence

import polars as pl

from trajscope.errors import TrajscopeError
from trajscope.studies.common import Provenance, delta_frame
from trajscope.studies.prompts import common_prefix_len, shared_prefix_len, token_classes

MIN_SHARED = 4


def check_shared_prefix(seqs: Sequence[Sequence[int]], min_shared: int = MIN_SHARED) -> int:
    """The set-wide shared prefix length in tokens; one clear error when it is under ``min_shared``."""
    n = shared_prefix_len(seqs)
    if len(seqs) < 2 or n < min_shared:
        raise TrajscopeError(
            f"The prompts share a prefix of only {n} token(s) across {len(seqs)} prompt(s); the prefix-cache study "
            f"needs at least 2 prompts sharing {min_shared}+ tokens (a system prompt or header, e.g. --header default).")
    return n


def plan_reuse(seqs: Sequence[Sequence[int]], *, warm: bool = True, block: int = 1,
               min_shared: int = MIN_SHARED) -> list[int]:
    """Leading tokens of each prompt served from the prefix cache, in order.

    Args:
        seqs: token ids per prompt, in serving order.
        warm: the set-wide shared prefix is in the cache before the first prompt (a cached
            system prompt); otherwise the cache starts empty and fills with each prompt.
        block: cache granularity in tokens (vLLM uses 16; 1 = a token-level radix cache).
        min_shared: the set must share at least this many leading tokens (else one clear error).
    Returns:
        ``reused[i]`` per prompt; prompt i computes its last ``len(seqs[i]) − reused[i]`` tokens.
    """
    if block < 1:
        raise TrajscopeError(f"The cache block size must be a positive number of tokens, not {block}.")
    shared = check_shared_prefix(seqs, min_shared)
    cached: list[Sequence[int]] = [list(seqs[0][:shared])] if warm else []
    out = []
    for s in seqs:
        r = max((common_prefix_len(c, s) for c in cached), default=0)
        r = min((r // block) * block, len(s) - 1)
        out.append(max(r, 0))
        cached.append(s)
    return out


def coverage_map(model: Any, prompts: Sequence[tuple[str, list[int]]], reused: Sequence[int]) -> pl.DataFrame:
    """Per prompt and position: ``status`` (computed / reused), ``region`` (shared / own),
    ``token_class`` and ``pos_band``; plus ``prompt_id``, ``pos``, ``token_id``."""
    shared = shared_prefix_len([ids for _, ids in prompts])
    frames = []
    for (pid, ids), r in zip(prompts, reused):
        n = len(ids)
        frames.append(pl.DataFrame({
            "prompt_id": [pid] * n, "pos": list(range(n)), "token_id": ids, "token_class": token_classes(model, ids),
            "region": ["shared" if p < shared else "own" for p in range(n)],
            "status": ["reused" if p < r else "computed" for p in range(n)],
        }, schema_overrides={"pos": pl.Int32, "token_id": pl.Int32}))
    df = pl.concat(frames)
    return df.with_columns(pos_band=pl.col("pos").map_elements(_pos_band, return_dtype=pl.String))


def _pos_band(p: int) -> str:
    for hi, label in ((4, "0-3"), (16, "4-15"), (64, "16-63"), (256, "64-255")):
        if p < hi:
            return label
    return "256+"


def coverage_summary(cov: pl.DataFrame) -> pl.DataFrame:
    """Share of activations never produced (``reused``), overall and by token class, region and
    position band: columns ``by``, ``group``, ``n_positions``, ``n_reused``, ``share_never_produced``."""
    parts = []
    for by in ("all", "token_class", "region", "pos_band"):
        key = pl.lit("all") if by == "all" else pl.col(by)
        g = cov.group_by(key.alias("group"), maintain_order=True).agg(
            n_positions=pl.len(), n_reused=(pl.col("status") == "reused").sum())
        parts.append(g.with_columns(by=pl.lit(by)))
    out = pl.concat(parts).with_columns(share_never_produced=pl.col("n_reused") / pl.col("n_positions"))
    return out.select("by", "group", "n_positions", "n_reused", "share_never_produced")


def prefix_reuse_deltas(model: Any, prompts: Sequence[tuple[str, list[int]]], reused: Sequence[int], *,
                        layers: Sequence[int] | None = None, progress: Any = None) -> pl.DataFrame:
    """Continuation on a cached prefix vs a full recompute, for every prompt that reused tokens.

    The KV of each distinct reused prefix is computed once (a prefix-only forward) and reused
    by every prompt that starts with it; the cache is copied per use, never changed.
    """
    layers = list(range(model.n_layers)) if layers is None else [int(x) for x in layers]
    caches: dict[tuple[int, ...], Any] = {}
    frames = []
    prov = Provenance.of(model, prefix_cache=True)
    for n, ((pid, ids), r) in enumerate(zip(prompts, reused)):
        if r > 0:
            key = tuple(ids[:r])
            if key not in caches:
                caches[key] = model.prefix_cache(list(key))
            cont = model.forward(ids[r:], past=caches[key], layers=layers)
            full = model.forward(ids, layers=layers)
            df = delta_frame({k: v[r:] for k, v in full.resid.items()}, cont.resid, logits_a=full.logits[r:],
                             logits_b=cont.logits, prompt_id=pid, reused=r)
            frames.append(prov.with_columns(df.with_columns(pos=pl.col("pos") + r)))
        if progress is not None:
            progress(n + 1, len(prompts))
    if not frames:
        raise TrajscopeError("No prompt reused any cached token, so there is nothing to compare.")
    return pl.concat(frames, how="vertical_relaxed")
