"""Settings and result of the app's Compaction card, as a ``param`` object (no Panel here).

The card runs one compacted session ``<sys> <T1> <T2> <summary> <T3>`` three ways (and the
control D) through the study's own :func:`~trajscope.studies.compaction.study.compaction` on that one
session — exactly what the study does, returning the study's :class:`~trajscope.studies.registry.Result`: **A** masks T1/T2 from T3's first query on (the summary's states are
kept), **B** restarts from ``<sys> <summary> <T3>``, **C** keeps everything. It shows the three
setups' greedy continuations after T3 side by side, the per-layer divergence of T3's hidden
states from C, the attention mass of T3's queries on the summary, and — from the *shipped* study
tables of the same model, since one session cannot train a probe — the probe's held-out accuracy
by layer.

:class:`CompactionSettings` holds the five segment texts (a synthetic session by default,
:meth:`CompactionSettings.use_synthetic`), the number of greedy tokens, the
:class:`CardResult` of the last run (that Result, the session and the shipped probe) and the one-line
summary, which reads the Result's summary rows (:func:`summary_line`). :func:`run_session` is pure
with respect to the app (safe off the event loop).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import param
import polars as pl

from trajscope.errors import TrajscopeError
from trajscope.studies.registry import Result
from trajscope.studies.sessions import SEGMENTS, Session, synthetic_sessions

SETUP_LABELS = {"A": "A · mask T1/T2 (summary states kept)", "B": "B · restart from <sys> <summary>",
                "C": "C · full context", "D": "D · mask from the summary on (control)"}


def shipped_study_dir() -> pathlib.Path:
    """The study shipped with the sample model: ``sample_data/reports/compaction``."""
    from trajscope.model import sample_data_dir

    return sample_data_dir() / "reports" / "compaction"


@dataclasses.dataclass
class CardResult:
    """What one run of the card found for one session.

    Attributes:
        session: the session that ran.
        result: the compaction study's Result of that one session (no probe).
        probe: the shipped study's ``compaction_probe`` table for this model, or None.
        probe_note: where the probe table comes from (or why there is none).
        n_new: greedy tokens per setup.
    """

    session: Session
    result: Result
    probe: pl.DataFrame | None
    probe_note: str
    n_new: int

    @property
    def summary(self) -> pl.DataFrame:
        """The Result's ``compaction_summary`` (one session: no intervals)."""
        return self.result.table("compaction_summary")

    @property
    def states(self) -> pl.DataFrame:
        return self.result.table("compaction_states")

    @property
    def attention(self) -> pl.DataFrame:
        return self.result.table("compaction_attention")

    @property
    def continuations(self) -> dict[str, str]:
        """``{setup: greedy text after T3}`` for A, B, C and D (the decode table's rows)."""
        dec = self.result.table("compaction_decode")
        out = dict(zip(dec["setup"].to_list(), dec["text"].to_list()))
        out["C"] = dec["text_full"][0] if dec.height else ""
        return out

    @property
    def first_divergence(self) -> dict[str, int | None]:
        """``{setup: index where the continuation leaves C's, or None}`` for A, B and D."""
        dec = self.result.table("compaction_decode")
        return dict(zip(dec["setup"].to_list(), dec["first_divergence"].to_list()))


def shipped_probe(model_id: str, study_dir: pathlib.Path | None = None) -> tuple[pl.DataFrame | None, str]:
    """The shipped study's probe table when it was run on ``model_id``; else ``(None, the reason)``."""
    d = shipped_study_dir() if study_dir is None else pathlib.Path(study_dir)
    shipped = Result.load(d, "compaction")
    try:
        probe = shipped.table("compaction_probe")
    except TrajscopeError:
        return None, f"No probe table: no compaction study at {d}."
    settings = shipped.config
    ran_on = settings.get("model", {}).get("model_id")
    if ran_on != model_id:
        return None, (f"No probe table for '{model_id}': the shipped study ran on '{ran_on}' (run 'trajscope study "
                      "compaction' on this model for one).")
    r = probe.row(0, named=True) if probe.height else {}
    return probe, (f"Probe from the shipped study ({settings.get('n_sessions')} synthetic sessions of '{ran_on}': "
                   f"fitted on {r.get('n_train')}, scored on {r.get('n_test')} held-out sessions; 95% bootstrap "
                   "intervals over held-out sessions). One session cannot train a probe.")


def run_session(model: Any, session: Session, max_new_tokens: int, study_dir: pathlib.Path | None = None) -> CardResult:
    """Every setup of one session through the study's own run (:func:`~trajscope.studies.compaction.study.compaction`
    on that session, no probe); the shipped probe beside it.

    Args:
        model: a local :class:`~trajscope.model.ModelHandle` (key masks do not run on NDIF).
        session: the five segments.
        max_new_tokens: greedy tokens after T3 per setup (≥ 1).
    Raises:
        TrajscopeError: a remote model, too few tokens, or the session's own errors (one sentence).
    """
    from trajscope.studies.compaction.study import compaction

    if model.remote is True:
        raise TrajscopeError("The compaction card needs key masks, which run on a local model only.")
    if max_new_tokens < 1:
        raise TrajscopeError(f"Ask for at least 1 new token after T3, not {max_new_tokens}.")
    result = compaction(model, [session], max_new_tokens=max_new_tokens, probe=False)
    probe, note = shipped_probe(model.model_id, study_dir)
    return CardResult(session, result, probe, note, max_new_tokens)


def summary_line(res: CardResult) -> str:
    """One sentence: where A, B and D leave C's continuation, then the Result's headline (A vs C rel. L2 at the
    deepest block), B's rel. L2 and the attention on the summary at that block — rows of its summary, read."""
    from trajscope.studies.compaction.summary import headline

    summ = res.summary
    head = headline(summ)
    last = head["layer"]

    def row(metric: str, pair: str) -> float:
        r = summ.filter((pl.col("metric") == metric) & (pl.col("pair") == pair) & (pl.col("layer") == last))
        return r["estimate"][0] if r.height else float("nan")

    def fd(s: str) -> str:
        v = res.first_divergence.get(s)
        return "never leaves C's" if v is None else f"leaves C's at token {v}"

    att = {s: row("attention_summary_mass", s) for s in ("A", "B", "C")}
    return (f"Session {res.session.session_id}: over {res.n_new} greedy tokens, A {fd('A')}, B {fd('B')}, D {fd('D')}. "
            f"Block {last}: rel. L2 to C {head['estimate']:.3f} (A) and {row('rel_l2', 'B_vs_C'):.3f} (B); attention "
            f"on the summary {att['A']:.3f} (A), {att['B']:.3f} (B), {att['C']:.3f} (C). One session: no interval.")


class CompactionSettings(param.Parameterized):
    """One compacted session to run A/B/C on, and what the card found."""

    sys = param.String(default="", doc="System segment (first; tokenized with the tokenizer's special tokens).")
    t1 = param.String(default="", doc="Turn T1 (compacted: masked under A, dropped under B).")
    t2 = param.String(default="", doc="Turn T2 (compacted: masked under A, dropped under B).")
    summary_text = param.String(default="", doc="The summary that replaces T1 and T2.")
    t3 = param.String(default="", doc="Turn T3 after the summary; the continuations follow it.")
    seed = param.Integer(default=0, bounds=(0, 9999), doc="Seed of the synthetic session the fields are filled with.")
    max_new_tokens = param.Integer(default=16, doc="Greedy tokens after T3 per setup (≥ 1).")
    busy = param.Boolean(default=False, doc="A run is in progress.")
    status = param.String(default="", doc="Progress line, or the one error sentence.")
    result = param.ClassSelector(class_=CardResult, allow_None=True, doc="The last run's result (None before a run).")
    summary = param.String(default="", doc="One-line summary of the result.")

    def __init__(self, **params):
        super().__init__(**params)
        if not any(params.get(k) for k in ("sys", "t1", "t2", "summary_text", "t3")):
            self.use_synthetic(self.seed)

    def use_synthetic(self, seed: int | None = None) -> Session:
        """Fill the fields with synthetic session ``seed`` (the study's generator) and forget the result."""
        seed = self.seed if seed is None else int(seed)
        s = synthetic_sessions(seed + 1, seed=0)[seed]  # session i of the study's own seed-0 set
        self.param.update(sys=s.sys, t1=s.t1, t2=s.t2, summary_text=s.summary, t3=s.t3, seed=seed, result=None,
                          summary="", status="")
        return s

    def session(self) -> Session:
        """The session the fields describe (the synthetic one keeps its id, fact and label when unchanged).

        Raises:
            TrajscopeError: an empty segment, or the session over the server's prompt cap (one sentence).
        """
        from trajscope.ui.operator import config

        texts = {"sys": self.sys, "t1": self.t1, "t2": self.t2, "summary": self.summary_text, "t3": self.t3}
        for text in texts.values():  # each field, as the page limits it: checked before anything tokenises it
            config().prompt(text)
        syn = synthetic_sessions(self.seed + 1, seed=0)[self.seed]
        if all(texts[k] == getattr(syn, k) for k in SEGMENTS):
            return syn
        return Session.from_dict({**texts, "id": "typed"}, default_id="typed")

    def clear(self) -> None:
        """Forget the result."""
        self.param.update(result=None, summary="", status="")
