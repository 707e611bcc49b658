"""The compaction study over many sessions: every setup of every session, the probe, and the Result.

:func:`compaction` runs :func:`~trajscope.studies.compaction.engine.measure_session` on each session,
fits the held-out probe (:func:`probe_table`) and returns the study's
:class:`~trajscope.studies.registry.Result`: the tables ``compaction_sessions``, ``compaction_states``,
``compaction_next_token``, ``compaction_attention``, ``compaction_decode``, ``compaction_probe`` (see
:mod:`trajscope.studies.compaction.engine`) and ``compaction_summary``
(:func:`trajscope.studies.compaction.summary.summarize`, the one home of the study's means and
intervals). :func:`run` is the registered study's run: its sessions come from the config
(``--sessions FILE`` or ``--synthetic N``), not from a prompt set.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np
import polars as pl
import torch

from trajscope.errors import TrajscopeError
from trajscope.studies import probe as pr
from trajscope.studies.compaction.engine import MASKED, SETUPS, measure_session, plant_directions
from trajscope.studies.compaction import summary as sm
from trajscope.studies.registry import Result
from trajscope.studies.sessions import Session, tokenize_session

PROBE_RUNS = (("A", "A"), ("B", "B"), ("C", "C"), ("D", "D"), ("C", "A"), ("C", "B"))


def run(model: Any, prompts: Any, config: Any, progress: Callable[[int, int], None] | None = None,
        layers: Sequence[int] | None = None) -> Result:
    """The registered study's run: the sessions of a :class:`~trajscope.studies.compaction.config.CompactionConfig`
    (``prompts`` is not used) through :func:`compaction`."""
    from trajscope.studies.sessions import read_sessions, synthetic_sessions

    sessions = read_sessions(config.sessions) if config.sessions else synthetic_sessions(config.synthetic, config.seed)
    return compaction(model, sessions, layers=layers, max_new_tokens=config.max_new_tokens, probe=not config.no_probe,
                      test_fraction=config.test_fraction, seed=config.seed, plant_strength=config.plant_strength,
                      plant_layer=config.plant_layer, n_boot=config.n_boot, progress=progress,
                      config=dataclasses.asdict(config))


def _layers(model: Any, layers: Sequence[int] | None) -> list[int]:
    chosen = list(range(model.n_layers)) if layers is None else sorted({int(x) for x in layers})
    bad = [x for x in chosen if not 0 <= x < model.n_layers]
    if bad or not chosen:
        raise TrajscopeError(f"Layers must be in 0..{model.n_layers - 1}; got {list(layers or [])}.")
    return chosen


def compaction(model: Any, sessions: Sequence[Session], *, layers: Sequence[int] | None = None,
               max_new_tokens: int = 16, masked: Sequence[str] = MASKED, probe: bool = True,
               test_fraction: float = 0.3, seed: int = 0, plant_strength: float = 0.0, plant_layer: int = 0,
               level: float = 0.95, n_boot: int = 1000, attention: bool = True,
               progress: Callable[[int, int], None] | None = None, config: dict | None = None) -> Result:
    """Run setups A, B, C and D on every session and measure how they differ (module docstring).

    Args:
        model: a local :class:`~trajscope.model.ModelHandle`.
        sessions: the sessions (:func:`~trajscope.studies.sessions.read_sessions` or ``synthetic_sessions``).
        layers: blocks to compare and probe (default: all).
        max_new_tokens: greedy tokens after T3 per setup (0: no decode table; skipped when planting,
            since masked decode takes no steering).
        masked: the segments A hides.
        probe: fit the probes (needs every session to have a ``label``, and enough sessions to hold out).
        test_fraction: held-out share of the sessions for the probe; the split is seeded by ``seed``.
        plant_strength, plant_layer: the planted signal (module docstring); 0 = none.
        level, n_boot: bootstrap intervals.
        attention: measure the attention mass of T3's queries (``compaction_attention``).
        progress: called with ``(done, total)`` after each session.
        config: the config to record in the Result (default: these arguments).
    Returns:
        The compaction study's :class:`~trajscope.studies.registry.Result` (module docstring for its tables;
        its summaries are :func:`~trajscope.studies.compaction.summary.headlines`).
    Raises:
        TrajscopeError: a session that does not fit, a probe without labels, or too few sessions to hold out.
    """
    if not sessions:
        raise TrajscopeError("The compaction study needs at least one session.")
    if model.remote is True:
        raise TrajscopeError("The compaction study needs key masks, which run on a local model only.")
    layers = _layers(model, layers)
    labels = [s.label for s in sessions]
    planting = plant_strength != 0
    if (probe or planting) and any(lab is None for lab in labels):
        raise TrajscopeError("The probe (and a planted signal) needs a 'label' on every session; give labels or "
                             "turn the probe off.")
    split = np.zeros(len(sessions), dtype=bool)
    train_idx = test_idx = None
    if probe:
        train_idx, test_idx = pr.split_sessions(len(sessions), test_fraction, seed)
        split[test_idx] = True
    n_decode = 0 if planting else int(max_new_tokens)
    toks = [tokenize_session(model, s, n_decode) for s in sessions]
    classes = sorted({int(x) for x in labels if x is not None})
    dirs = plant_directions(len(classes), model.d_model, seed) if planting else None

    states, kls, decode, atts = [], [], [], []
    feats = {s: torch.zeros(len(sessions), len(layers), model.d_model) for s in SETUPS}
    for i, (sess, tok) in enumerate(zip(sessions, toks)):
        plant = (dirs[classes.index(int(sess.label))], plant_layer, plant_strength) if planting else None
        st, kl, dec, last, att = measure_session(model, tok, layers, masked=masked, plant=plant,
                                                 max_new_tokens=n_decode, attention=attention)
        states.append(st)
        atts.append(att)
        kls.append(kl)
        decode.extend(dec)
        for s in SETUPS:
            feats[s][i] = last[s]
        if progress is not None:
            progress(i + 1, len(sessions))

    sess_df = pl.DataFrame({
        "session_id": [s.session_id for s in sessions], "split": ["test" if t else "train" for t in split] if probe
        else ["all"] * len(sessions), "label": pl.Series(labels, dtype=pl.Int64), "fact": [s.fact for s in sessions],
        **{f"n_{k}": [len(t.segments[k]) for t in toks] for k in ("sys", "t1", "t2", "summary", "t3")}})
    dec_schema = dict(session_id=pl.Utf8, setup=pl.Utf8, first_divergence=pl.Int32, agree_fraction=pl.Float64,
                      n_new=pl.Int32, text=pl.Utf8, text_full=pl.Utf8)
    probe_df = probe_table(feats, torch.tensor(labels), layers, train_idx, test_idx, seed=seed, level=level,
                           n_boot=n_boot) if probe else pl.DataFrame()
    settings = dict(n_sessions=len(sessions), layers=layers, max_new_tokens=n_decode, masked=list(masked), probe=probe,
                    test_fraction=test_fraction, seed=seed, plant_strength=plant_strength, plant_layer=plant_layer,
                    level=level, n_boot=n_boot)
    settings = {**(config or settings), **settings, "model": model.describe(),
                "attention_mass": "measured: attention rows of T3's queries" if attention else "not measured"}
    tables = {"compaction_sessions": sess_df, "compaction_states": pl.concat(states),
              "compaction_next_token": pl.concat(kls), "compaction_attention": pl.concat(atts),
              "compaction_decode": pl.DataFrame(decode, schema=dec_schema), "compaction_probe": probe_df}
    summary = sm.summarize(tables["compaction_states"], tables["compaction_next_token"], tables["compaction_attention"],
                        tables["compaction_decode"], level=level, n_boot=n_boot)
    tables["compaction_summary"] = summary
    return Result(study="compaction", tables=tables, config=settings, summaries=sm.headlines(summary))


def probe_table(features: dict[str, torch.Tensor], labels: torch.Tensor, layers: Sequence[int], train_idx: np.ndarray,
                test_idx: np.ndarray, *, seed: int = 0, level: float = 0.95, n_boot: int = 1000) -> pl.DataFrame:
    """Held-out probe accuracy per layer, (train setup, test setup) and control (``real``/``shuffled``).

    Args:
        features: ``{setup: [n_sessions, n_layers, d_model]}`` (the last T3 token's block outputs).
        labels: ``[n_sessions]`` integer labels.
        layers: the layer of each feature column.
        train_idx, test_idx: the disjoint split (:func:`~trajscope.studies.probe.split_sessions`).
    Returns:
        One row per layer × (train_setup, test_setup) × control: accuracy, lo, hi, majority, chance,
        n_train, n_test, lam (the ridge penalty chosen by leave-one-out).
    """
    rows = []
    for j, layer in enumerate(layers):
        for tr, te in PROBE_RUNS:
            for control in ("real", "shuffled"):
                sc = pr.score_probe(features[tr][:, j], labels, train_idx, test_idx, shuffle=control == "shuffled",
                                    x_test=features[te][:, j], seed=seed, level=level, n_boot=n_boot)
                rows.append(dict(layer=layer, train_setup=tr, test_setup=te, control=control, accuracy=sc.accuracy,
                                 lo=sc.lo, hi=sc.hi, majority=sc.majority, chance=sc.chance, n_train=sc.n_train,
                                 n_test=sc.n_test, lam=sc.lam))
    return pl.DataFrame(rows)
