"""Settings and result of the app's Compaction card, as a ``param`` object (no Panel here).

The card runs one compacted session ``<sys> <T1> <T2> <summary> <T3>`` three ways (and the
control D) through :func:`trajscope.studies.compaction.measure_session` — exactly what the
study does per session: **A** masks T1/T2 from T3's first query on (the summary's states are
kept), **B** restarts from ``<sys> <summary> <T3>``, **C** keeps everything. It shows the three
setups' greedy continuations after T3 side by side, the per-layer divergence of T3's hidden
states from C, the attention mass of T3's queries on the summary, and — from the *shipped* study
tables of the same model, since one session cannot train a probe — the probe's held-out accuracy
by layer.

:class:`CompactionSettings` holds the five segment texts (a synthetic session by default,
:meth:`CompactionSettings.use_synthetic`), the number of greedy tokens, the
:class:`CardResult` of the last run and the one-line summary. :func:`run_session` is pure with
respect to the app (safe off the event loop).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import param
import polars as pl

from trajscope.errors import TrajscopeError
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
        continuations: ``{setup: greedy text after T3}`` for A, B, C and D.
        first_divergence: ``{setup: index where the continuation leaves C's, or None}`` for A, B, D.
        states, next_token, attention: the session's ``compaction_states`` / ``_next_token`` /
            ``_attention`` rows (:mod:`trajscope.studies.compaction`).
        probe: the shipped study's ``compaction_probe`` table for this model, or None.
        probe_note: where the probe table comes from (or why there is none).
        n_new: greedy tokens per setup.
    """

    session: Session
    continuations: dict[str, str]
    first_divergence: dict[str, int | None]
    states: pl.DataFrame
    next_token: pl.DataFrame
    attention: pl.DataFrame
    probe: pl.DataFrame | None
    probe_note: str
    n_new: int


def shipped_probe(model_id: str, study_dir: pathlib.Path | None = None) -> tuple[pl.DataFrame | None, str]:
    """The shipped study's probe table when it was run on ``model_id``; else ``(None, the reason)``."""
    d = shipped_study_dir() if study_dir is None else pathlib.Path(study_dir)
    f, s = d / "compaction_probe.parquet", d / "settings.json"
    if not f.exists() or not s.exists():
        return None, f"No probe table: no compaction study at {d}."
    settings = json.loads(s.read_text(encoding="utf-8"))
    ran_on = settings.get("model", {}).get("model_id")
    if ran_on != model_id:
        return None, (f"No probe table for '{model_id}': the shipped study ran on '{ran_on}' (run 'trajscope study "
                      "compaction' on this model for one).")
    probe = pl.read_parquet(f)
    r = probe.row(0, named=True) if probe.height else {}
    return probe, (f"Probe from the shipped study ({settings.get('n_sessions')} synthetic sessions of '{ran_on}': "
                   f"fitted on {r.get('n_train')}, scored on {r.get('n_test')} held-out sessions; 95% bootstrap "
                   "intervals over held-out sessions). One session cannot train a probe.")


def run_session(model: Any, session: Session, max_new_tokens: int, study_dir: pathlib.Path | None = None) -> CardResult:
    """Every setup of one session through the study's own per-session path; the shipped probe beside it.

    Args:
        model: a local :class:`~trajscope.model.ModelHandle` (key masks do not run on NDIF).
        session: the five segments.
        max_new_tokens: greedy tokens after T3 per setup (≥ 1).
    Raises:
        TrajscopeError: a remote model, too few tokens, or the session's own errors (one sentence).
    """
    from trajscope.studies.compaction import measure_session
    from trajscope.studies.sessions import tokenize_session

    if model.remote is True:
        raise TrajscopeError("The compaction card needs key masks, which run on a local model only.")
    if max_new_tokens < 1:
        raise TrajscopeError(f"Ask for at least 1 new token after T3, not {max_new_tokens}.")
    tok = tokenize_session(model, session, max_new_tokens)
    layers = list(range(model.n_layers))
    states, kls, decode, _, att = measure_session(model, tok, layers, max_new_tokens=max_new_tokens)
    cont = {r["setup"]: r["text"] for r in decode}
    cont["C"] = decode[0]["text_full"]
    first = {r["setup"]: r["first_divergence"] for r in decode}
    probe, note = shipped_probe(model.model_id, study_dir)
    return CardResult(session, cont, first, states, kls, att, probe, note, max_new_tokens)


def summary_line(res: CardResult) -> str:
    """One sentence: where A, B and D leave C's continuation, and the last layer's divergence and summary mass."""
    last = res.states["layer"].max()
    rel = res.states.filter((pl.col("layer") == last) & pl.col("pair").is_in(["A_vs_C", "B_vs_C"])).group_by(
        "pair").agg(pl.col("rel_l2").mean())
    rel = dict(zip(rel["pair"], rel["rel_l2"]))
    att = res.attention.filter(pl.col("layer") == last).group_by("setup").agg(pl.col("summary_mass").mean())
    att = dict(zip(att["setup"], att["summary_mass"]))

    def fd(s: str) -> str:
        v = res.first_divergence.get(s)
        return "never leaves C's" if v is None else f"leaves C's at token {v}"

    return (f"Session {res.session.session_id}: over {res.n_new} greedy tokens, A {fd('A')}, B {fd('B')}, D {fd('D')}. "
            f"Block {last}: rel. L2 to C {rel.get('A_vs_C', float('nan')):.3f} (A) and {rel.get('B_vs_C', float('nan')):.3f} "
            f"(B); attention on the summary {att.get('A', float('nan')):.3f} (A), {att.get('B', float('nan')):.3f} (B), "
            f"{att.get('C', float('nan')):.3f} (C). One session: no interval.")


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
