"""What each step computed about the next token: its distribution's entropy and the produced token's logprob.

Step ``s`` reads the next-token distribution at its query (position ``P − 1`` for
the prefill step, ``P + s − 1`` for decode step ``s``) and produces the token at
``P + s``. Per DESIGN.md, both numbers are *computed by* step ``s`` and so belong at
``x = s``: the entropy of that distribution and the logprob of the token it
produced. The app's next-token plot, the report's steering curves and any export
of them take their rows from :func:`step_outputs`, so they cannot disagree.
"""

from __future__ import annotations

import polars as pl

from trajscope import positions


def step_outputs(tokens: pl.DataFrame | pl.LazyFrame, prompt_len: int) -> pl.DataFrame:
    """One row per step ``s ≥ 0`` that produced a token.

    Args:
        tokens: a run's ``tokens`` table (pos, text, logprob, entropy).
        prompt_len: P.
    Returns:
        ``step`` (Int32), ``entropy`` (of the distribution step s computed, nats; null where it was not
        computed), ``logprob`` (of the token step s produced), ``text`` (that token), sorted by step.
    """
    t = tokens.lazy()
    query = t.filter(pl.col("pos") >= prompt_len - 1).select(
        positions.query_step_expr(prompt_len), pl.col("entropy"))
    produced = t.filter(pl.col("pos") >= prompt_len).select(
        positions.produced_at_step_expr(prompt_len).alias("step"), pl.col("logprob"), pl.col("text"))
    return produced.join(query, on="step", how="left").select("step", "entropy", "logprob", "text").sort(
        "step").collect()
