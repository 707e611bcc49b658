"""Steps, positions, phases and segments: the one home of trajscope's vocabulary (DESIGN.md).

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

``segment`` is the conversational regime of a position, beside ``phase``:
``"system"``, ``"user"``, ``"assistant"`` or ``"thinking"`` (:data:`SEGMENTS`).
A chat prompt's positions take the segment of the message whose turn renders
them (:mod:`trajscope.chat`; role markup belongs to its message's turn);
generated tokens are ``"assistant"``. A plain-text (or token-id) prompt is
``"user"`` at every prompt position, so a continuation splits the same way:
the user's text, then the model's. Inside an assistant turn or the generated
text, everything from a thinking opening tag to its closing tag, both tags
included (:data:`THINK_TAGS`, e.g. ``<think>…</think>``), is ``"thinking"``; an
unclosed tag thinks to the end. :func:`thinking_spans` finds these spans in
text, :func:`segment_runs` / :func:`segments_from_runs` convert between
per-position labels and the run-length form that ``meta.json`` records.

Position 0 is the *attention sink* (:data:`SINK_POS`): real models park attention
on the first token and give it massive activations (SmolLM2-135M: |x| ≈ 29,000 at
position 0, about 98% of a prompt's centred variance at a middle layer), so it
would dominate every variance-based reference. The one treatment
(:data:`SKIP_SINK`): every *reference statistic* — the prefill profile, the
drift study's prefill rows, SAE harvests and therefore SAE training — leaves
position 0 out, starting at :func:`first_reference_pos`; capture's own tables
(tokens, attention with ``sink_mass``, activations with ``n_massive``) keep it,
so the sink stays visible. Each artefact records the choice with
:func:`sink_meta`. The rule for "massive" lives in
:mod:`trajscope.metrics.residual_stats`.
"""

from __future__ import annotations

from typing import Union

import numpy as np
import polars as pl
import torch

PREFILL = "prefill"
DECODE = "decode"
PHASES = (PREFILL, DECODE)

SYSTEM = "system"
USER = "user"
ASSISTANT = "assistant"
THINKING = "thinking"
SEGMENTS = (SYSTEM, USER, ASSISTANT, THINKING)
PLAIN_PROMPT_SEGMENT = USER  # every position of a plain-text or token-id prompt
GENERATED_SEGMENT = ASSISTANT  # generated tokens, outside thinking spans
ROLE_SEGMENT = {"system": SYSTEM, "developer": SYSTEM, "user": USER, "tool": USER, "assistant": ASSISTANT}
THINK_TAGS = (("<think>", "</think>"), ("<thinking>", "</thinking>"))

SINK_POS = 0
SKIP_SINK = True
SINK_RULE = ("position 0 (the attention sink) is left out of reference statistics: prefill profiles, drift "
             "prefill rows, SAE harvests and SAE training; capture tables keep it")

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


def first_reference_pos(skip_sink: bool = SKIP_SINK) -> int:
    """The first position a reference statistic uses: 1 when the sink is left out (the default), else 0."""
    return SINK_POS + 1 if skip_sink else SINK_POS


def sink_meta(skip_sink: bool = SKIP_SINK) -> dict:
    """What an artefact records about position 0: ``{"sink_pos", "sink_excluded", "sink_rule"}``."""
    return {"sink_pos": SINK_POS, "sink_excluded": bool(skip_sink),
            "sink_rule": SINK_RULE if skip_sink else "position 0 (the attention sink) is included"}


def thinking_spans(text: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of thinking in ``text``: each opening tag through its closing tag.

    An opening tag with no closing tag thinks to the end of the text (a generation cut off mid-thought).
    """
    spans, i = [], 0
    while True:
        found = [(text.find(o, i), o, c) for o, c in THINK_TAGS if text.find(o, i) >= 0]
        if not found:
            return spans
        start, _, close = min(found)
        j = text.find(close, start)
        end = len(text) if j < 0 else j + len(close)
        spans.append((start, end))
        i = end


def overlaps_thinking(starts: list[int], ends: list[int], text: str, open_at_start: bool = False) -> list[bool]:
    """Whether each character range ``[start, end)`` of ``text`` overlaps a :func:`thinking_spans` span.

    ``open_at_start``: the text continues a thought opened before it (a prompt that ends inside one).
    """
    shift = len(THINK_TAGS[0][0]) if open_at_start else 0
    spans = thinking_spans(THINK_TAGS[0][0] + text if open_at_start else text)
    spans = [(a - shift, b - shift) for a, b in spans]
    return [any(a < e and s < b for a, b in spans) if e > s else any(a <= s < b for a, b in spans)
            for s, e in zip(starts, ends)]


def generated_segments(texts: list[str], thinking_open: bool = False) -> list[str]:
    """Segments of generated tokens (their decoded texts, in order): ``"thinking"`` where a token overlaps a
    thinking span of the concatenated text, ``"assistant"`` elsewhere."""
    starts, ends, at = [], [], 0
    for t in texts:
        starts.append(at)
        at += len(t)
        ends.append(at)
    think = overlaps_thinking(starts, ends, "".join(texts), thinking_open)
    return [THINKING if k else GENERATED_SEGMENT for k in think]


def segment_runs(labels: list[str]) -> list[list]:
    """Run-length form ``[[segment, start_pos, end_pos], ...]`` (end exclusive) of per-position labels."""
    runs: list[list] = []
    for i, lab in enumerate(labels):
        if runs and runs[-1][0] == lab:
            runs[-1][2] = i + 1
        else:
            runs.append([lab, i, i + 1])
    return runs


def segments_from_runs(runs: list | None, n: int) -> list[str]:
    """Per-position labels of ``n`` positions from :func:`segment_runs` (None: a plain prompt, all ``"user"``)."""
    out = [PLAIN_PROMPT_SEGMENT] * n
    for seg, a, b in runs or ():
        out[a:b] = [seg] * (min(b, n) - a)
    return out


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


def with_segment(df: pl.DataFrame | pl.LazyFrame, tokens: pl.DataFrame, prompt_len: int | None = None):
    """``df`` plus the ``segment`` of its position, so any table can be grouped by segment as by phase.

    A table with a ``pos`` column takes that position's segment. A table keyed by ``step`` only (the
    telemetry and the other per-step tables) takes the segment of the step's **query** position,
    :func:`query_pos` (``prompt_len`` is then needed): step 0, the prefill pass, reads the whole
    prompt and gets the segment of its last position. ``tokens`` is the run's tokens table (``pos``,
    ``segment``).
    """
    seg = tokens.select(pl.col("pos").cast(pl.Int64), "segment")
    lazy = isinstance(df, pl.LazyFrame)
    cols = df.collect_schema().names() if lazy else df.columns
    if "segment" in cols:
        return df
    seg_frame = seg.lazy() if lazy else seg
    if "pos" in cols:
        key = pl.col("pos").cast(pl.Int64)
    elif "step" in cols and prompt_len is not None:
        key = query_pos_expr(prompt_len).cast(pl.Int64)
    else:
        raise ValueError("with_segment needs a 'pos' column, or a 'step' column and prompt_len")
    return df.with_columns(key.alias("__pos")).join(seg_frame.rename({"pos": "__pos"}), on="__pos", how="left",
                                                    maintain_order="left").drop("__pos")
