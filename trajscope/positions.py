"""Steps, positions and phases: the one home of trajscope's vocabulary (DESIGN.md).

With a prompt of ``P`` tokens:

- ``pos`` is an absolute token position, 0-based;
- ``step`` 0 is the prefill forward pass (every prompt position is a query);
  step ``s ≥ 1`` is the s-th decode pass, whose single query is the token at
  ``pos = P + s − 1``. The *query step* of a position is therefore
  ``max(0, pos − P + 1)`` (:func:`query_step`), and the last query of step s is
  :func:`query_pos` (``P − 1`` at step 0);
- step ``s`` *produces* the token at ``pos = P + s`` (:func:`produced_pos`); the
  step that produced a generated token is ``pos − P`` (:func:`produced_at_step`,
  null for prompt tokens). A table that needs it calls the column
  ``produced_at_step``, never ``step``;
- ``phase`` is ``"prefill"`` for ``pos < P`` and ``"decode"`` otherwise.

A value *computed by* step s (the next-token distribution at its query, the
logprob of the token it produced, an attention row of its query) is plotted at
``x = s``. Every table, plot, report and view converts through this module; no
other file writes ``P + s − 1`` by hand. Each rule comes three ways: plain
functions over ints (and NumPy arrays), Polars expressions (``*_expr``; the
prompt length may be an int or an expression such as ``pl.col("prompt_len")``),
and :func:`step_of_positions` for a torch ``[T]`` step index.
"""

from __future__ import annotations

from typing import Union

import numpy as np
import polars as pl
import torch

PREFILL = "prefill"
DECODE = "decode"
PHASES = (PREFILL, DECODE)

IntLike = Union[int, np.ndarray]
LenLike = Union[int, pl.Expr]


# -- plain functions -----------------------------------------------------------------------
def query_step(pos: IntLike, prompt_len: int) -> IntLike:
    """The step in which ``pos`` was a query: 0 for prompt positions, ``pos − P + 1`` after."""
    if isinstance(pos, np.ndarray):
        return np.maximum(0, pos - prompt_len + 1)
    return max(0, int(pos) - int(prompt_len) + 1)


def query_pos(step: IntLike, prompt_len: int) -> IntLike:
    """The (last) query position of ``step``: ``P − 1`` for prefill, ``P + s − 1`` for decode."""
    if isinstance(step, np.ndarray):
        return np.where(step == 0, prompt_len - 1, prompt_len + step - 1)
    return int(prompt_len) - 1 if int(step) == 0 else int(prompt_len) + int(step) - 1


def query_positions(step: int, prompt_len: int) -> range:
    """Every query position of ``step``: ``range(0, P)`` for prefill, one position for decode."""
    return range(0, prompt_len) if step == 0 else range(prompt_len + step - 1, prompt_len + step)


def step_axis(pos: IntLike, prompt_len: int) -> IntLike:
    """Where a per-position value sits on a plot whose x-axis is the step: ``pos − P + 1``.

    A decode position lands on its query step; the prompt positions, all read at step 0, spread
    to its left (0 for the last one, −1, −2, … before it), so prefill stays visible as a band.
    """
    return pos - prompt_len + 1


def produced_pos(step: IntLike, prompt_len: int) -> IntLike:
    """The position of the token that ``step`` produces: ``P + s``."""
    return step + prompt_len


def produced_at_step(pos: int, prompt_len: int) -> int | None:
    """The step that produced the token at ``pos`` (``pos − P``), or None for a prompt token."""
    return int(pos) - int(prompt_len) if pos >= prompt_len else None


def phase(pos: int, prompt_len: int) -> str:
    """``"prefill"`` for prompt positions, ``"decode"`` for generated ones."""
    return PREFILL if pos < prompt_len else DECODE


def phases(pos: np.ndarray, prompt_len: int) -> np.ndarray:
    """:func:`phase` of an array of positions (NumPy strings)."""
    return np.where(pos < prompt_len, PREFILL, DECODE)


def step_of_positions(n_positions: int, prompt_len: int) -> torch.Tensor:
    """``[n_positions]`` int64: the query step of positions ``0..n_positions−1`` (for steering masks)."""
    return (torch.arange(n_positions) - prompt_len + 1).clamp_min(0)


# -- Polars expressions ----------------------------------------------------------------------
def _len(prompt_len: LenLike) -> pl.Expr:
    return prompt_len if isinstance(prompt_len, pl.Expr) else pl.lit(int(prompt_len))


def query_step_expr(prompt_len: LenLike, pos: str | pl.Expr = "pos") -> pl.Expr:
    """Int32 query step of a ``pos`` column (alias ``step``)."""
    p = pl.col(pos) if isinstance(pos, str) else pos
    return (p - _len(prompt_len) + 1).clip(lower_bound=0).cast(pl.Int32).alias("step")


def query_pos_expr(prompt_len: LenLike, step: str | pl.Expr = "step") -> pl.Expr:
    """Int32 last query position of a ``step`` column (alias ``pos``)."""
    s = pl.col(step) if isinstance(step, str) else step
    P = _len(prompt_len)
    return pl.when(s == 0).then(P - 1).otherwise(P + s - 1).cast(pl.Int32).alias("pos")


def produced_at_step_expr(prompt_len: LenLike, pos: str | pl.Expr = "pos") -> pl.Expr:
    """Int32 step that produced the token at ``pos``; null for prompt tokens (alias ``produced_at_step``)."""
    p = pl.col(pos) if isinstance(pos, str) else pos
    P = _len(prompt_len)
    return pl.when(p >= P).then(p - P).otherwise(None).cast(pl.Int32).alias("produced_at_step")


def phase_expr(prompt_len: LenLike, pos: str | pl.Expr = "pos") -> pl.Expr:
    """``"prefill"`` / ``"decode"`` of a ``pos`` column (alias ``phase``)."""
    p = pl.col(pos) if isinstance(pos, str) else pos
    return pl.when(p < _len(prompt_len)).then(pl.lit(PREFILL)).otherwise(pl.lit(DECODE)).alias("phase")


def with_position_columns(df: pl.DataFrame | pl.LazyFrame, prompt_len: LenLike, *,
                          step: bool = True, phase: bool = True, produced: bool = False):
    """``df`` (with a ``pos`` column) plus ``step`` / ``phase`` / ``produced_at_step`` columns."""
    exprs = [e for on, e in ((step, query_step_expr(prompt_len)), (phase, phase_expr(prompt_len)),
                             (produced, produced_at_step_expr(prompt_len))) if on]
    return df.with_columns(exprs)
