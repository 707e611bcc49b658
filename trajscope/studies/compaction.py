"""The context-compaction study: masking versus restart, and what the masked past leaves in the states.

When an agent's context ``<sys> <T1> <T2> <summary> <T3>`` is compacted (the summary
replaces T1 and T2), a serving stack can

- **A, mask**: hide T1 and T2 from every query from the start of T3 on, through the
  model boundary's key mask (``key_mask`` False on T1∪T2, ``mask_from`` = T3's first
  position). T3's tokens still attend to sys and the summary, and the summary's KV
  states — computed while T1 and T2 were visible — are kept;
- **B, restart**: recompute ``<sys> <summary> <T3>`` from scratch, with fresh positions;
- **C, full**: mask nothing (the reference);
- **D, mask early** (a control): T1 and T2 hidden from the summary's first query on, positions as
  in A — the summary's states computed as if the turns had never been there.

A differs from B in two ways: the summary's kept states saw T1/T2, and the restart closes the gap
of masked positions between sys and the summary (RoPE sees relative distances). D separates them:
**A vs D** is only what the masked turns leave in the kept summary states, **D vs B** only the
position gap. At block 0 A and D agree exactly (block-0 keys and values do not depend on context),
so A vs B there is the position gap alone.

All four run through the same path of the boundary (a key mask is always given —
all True for B and C), so A with nothing masked is C bit for bit and every difference
between A and C is the mask's. Rows are aligned by T3 token index ``t3_index``.

Measures (one table each; :meth:`CompactionResult.save` writes them as Parquet):

- ``compaction_states``: per session, pair (``A_vs_C``, ``B_vs_C``, ``D_vs_C``, ``A_vs_B``, ``A_vs_D``,
  ``D_vs_B``; the second setup is the reference), layer and T3 token: relative L2
  ``‖x − r‖ / ‖r‖`` and cosine of the block outputs;
- ``compaction_next_token``: per session, pair and T3 token: ``KL(p_ref ‖ p_x)`` of the next-token
  distribution (nats) and whether the argmax agrees;
- ``compaction_decode``: greedy continuations of ``max_new_tokens`` after T3 (every setup through
  :meth:`~trajscope.model.ModelHandle.masked_decode`): the first generated index where A, B or D
  leaves C's tokens (null when it never does) and the fraction of agreeing tokens;
- ``compaction_probe``: a linear probe (:mod:`trajscope.studies.probe`) reading each session's
  ``label`` (synthetic sessions: the masked number's first digit) from the last T3 token's block
  output, per layer, fitted and scored on a disjoint held-out split under each setup (and fitted
  under C, read under A and B), against chance and a shuffled-label control, with bootstrap
  intervals over held-out sessions;
- ``compaction_attention``: per session, setup, layer and T3 token, the attention mass T3's query
  puts on the summary's keys (and on sys, the masked turns and T3;
  :mod:`trajscope.studies.compaction_attention`), from the attention rows the boundary's forward
  returns with the setup's key mask applied;
- ``compaction_sessions``: the sessions, their split and segment lengths; ``compaction_summary``:
  means of the per-session measures with bootstrap intervals over sessions
  (:func:`trajscope.stats.cluster_bootstrap`, one value per session).

A *planted* run (``plant_strength > 0``) adds ``plant_strength · u_label`` (one fixed random unit
direction per class) to block ``plant_layer``'s output at every T1 position, through the
boundary's steering, in A, C and D (B has no T1): a known signal whose travel into T3 the probe
should see under C, and whose leak through the summary it measures under A.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Callable, Sequence

import numpy as np
import polars as pl
import torch

from trajscope.errors import TrajscopeError
from trajscope.steering import SteeringVector
from trajscope.studies import compaction_attention as ca
from trajscope.studies import probe as pr
from trajscope.studies.sessions import Session, SessionTokens, tokenize_session
from trajscope.trajectory import parquet_metadata

SETUPS = ("A", "B", "C", "D")
PAIRS = (("A", "C"), ("B", "C"), ("D", "C"), ("A", "B"), ("A", "D"), ("D", "B"))
MASKED = ("t1", "t2")
PROBE_RUNS = (("A", "A"), ("B", "B"), ("C", "C"), ("D", "D"), ("C", "A"), ("C", "B"))
TABLES = ("sessions", "states", "next_token", "attention", "decode", "probe", "summary")


@dataclasses.dataclass(frozen=True)
class SetupInput:
    """What one setup runs: ``ids [K]``, ``key_mask [K]`` bool, ``mask_from`` and T3's ``(start, end)``."""

    ids: list[int]
    key_mask: torch.Tensor
    mask_from: int
    t3: tuple[int, int]


def setup_input(tokens: SessionTokens, setup: str, masked: Sequence[str] = MASKED) -> SetupInput:
    """The ids, key mask and T3 span of ``setup`` (``"A"``, ``"B"``, ``"C"`` or ``"D"``) for one session.

    ``masked`` names the segments A and D hide (default T1 and T2; ``()`` makes A and D identical to C).
    A's mask applies from T3's first position, D's from the summary's.
    """
    if setup not in SETUPS:
        raise TrajscopeError(f"Unknown compaction setup '{setup}'; use one of {', '.join(SETUPS)}.")
    restart = setup == "B"
    ids = tokens.restart_ids if restart else tokens.ids
    t3 = tokens.span("t3", restart=restart)
    keep = torch.ones(len(ids), dtype=torch.bool)
    if setup in ("A", "D"):
        for seg in masked:
            a, b = tokens.span(seg)
            keep[a:b] = False
    return SetupInput(ids, keep, tokens.span("summary")[0] if setup == "D" else t3[0], t3)


def _plant_steering(tokens: SessionTokens, direction: torch.Tensor, layer: int, strength: float) -> tuple[list, int]:
    """A steering vector on exactly T1's positions and the ``prompt_len`` that places its steps there."""
    a, b = tokens.span("t1")
    # position p has step p − P + 1 with P = a: T1's positions are steps 1 … b − a
    return [SteeringVector(layer, direction, strength, start_step=1, end_step=b - a + 1, name="plant")], a


def run_setup(model: Any, tokens: SessionTokens, setup: str, *, layers: Sequence[int], masked: Sequence[str] = MASKED,
              plant: tuple[torch.Tensor, int, float] | None = None,
              attention: bool = False) -> tuple[torch.Tensor, dict[int, torch.Tensor]] | tuple:
    """Teacher-forced forward of one setup; the T3 rows only.

    Args:
        plant: ``(direction [d], layer, strength)`` added to T1's positions (A, C, D; B has no T1).
        attention: also return every layer's attention rows of T3's queries (the boundary's
            ``attention_rows``; needs a model loaded with ``attn="rows"`` or ``"eager"``).
    Returns:
        ``(logits [n_t3, vocab], {layer: [n_t3, d_model]})``, row ``i`` = T3 token ``i``; with ``attention``
        a third item ``{layer: [H, n_t3, K]}`` (K = the setup's context length).
    """
    inp = setup_input(tokens, setup, masked)
    steering, prompt_len = (), None
    if plant is not None and setup != "B":
        steering, prompt_len = _plant_steering(tokens, *plant)
    a, b = inp.t3
    out = model.forward(inp.ids, prompt_len=prompt_len, layers=layers, key_mask=inp.key_mask,
                        mask_from=inp.mask_from, steering=steering, attention_rows=(b - a) if attention else 0)
    logits, resid = out.logits[a:b], {k: v[a:b] for k, v in out.resid.items()}
    return (logits, resid, out.attn) if attention else (logits, resid)


def attention_spans(tokens: SessionTokens, setup: str, masked: Sequence[str] = MASKED) -> dict[str, list[tuple[int, int]]]:
    """Key spans of sys, the summary, the masked segments (none for B) and T3 in ``setup``'s context."""
    restart = setup == "B"
    spans = {k: [tokens.span(k, restart=restart)] for k in ("sys", "summary", "t3")}
    spans["masked"] = [] if restart else [tokens.span(k) for k in (masked or MASKED)]
    return spans


def state_distances(x: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``x, ref [n, d]``: relative L2 ``‖x − ref‖ / ‖ref‖`` and cosine, each ``[n]``."""
    x, ref = x.double(), ref.double()
    rel = (x - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-12)
    return rel, torch.nn.functional.cosine_similarity(x, ref, dim=-1)


def next_token_kl(ref_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``KL(p_ref ‖ p)`` in nats per row of ``[n, vocab]`` logits: ``[n]``."""
    lr, lx = ref_logits.double().log_softmax(-1), logits.double().log_softmax(-1)
    return (lr.exp() * (lr - lx)).sum(-1).clamp_min(0.0)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (over their common length), or None."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def greedy_continuations(model: Any, tokens: SessionTokens, n: int,
                         masked: Sequence[str] = MASKED) -> dict[str, list[int]]:
    """``{setup: the n greedy tokens after T3}``, each through the boundary's masked decode (from its ``mask_from``)."""
    out = {}
    for s in SETUPS:
        inp = setup_input(tokens, s, masked)
        ids = model.masked_decode(inp.ids, n, inp.key_mask, mask_from=inp.mask_from)
        out[s] = ids[len(inp.ids):]
    return out


def plant_directions(n_classes: int, d_model: int, seed: int = 0) -> torch.Tensor:
    """``[n_classes, d_model]`` fixed random orthonormal directions (one per class), from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d_model, n_classes, generator=g, dtype=torch.float64))
    return q.T.float().contiguous()


def measure_session(model: Any, tokens: SessionTokens, layers: Sequence[int], *, masked: Sequence[str] = MASKED,
                    plant: tuple[torch.Tensor, int, float] | None = None,
                    max_new_tokens: int = 0, attention: bool = True) -> tuple:
    """Every measure of one session (module docstring).

    Returns:
        ``(states, next_token, decode_rows, last, attention)``: the session's rows of ``compaction_states``
        and ``compaction_next_token``, its ``compaction_decode`` rows (none when ``max_new_tokens`` is 0),
        ``{setup: [n_layers, d_model]}`` the last T3 token's block outputs (the probe's features), and its
        ``compaction_attention`` rows (empty when ``attention`` is False).
    """
    sid = pl.lit(tokens.session_id)
    runs = {s: run_setup(model, tokens, s, layers=layers, masked=masked, plant=plant, attention=attention)
            for s in SETUPS}
    att = (pl.concat([ca.attention_rows_table(tokens.session_id, s, runs[s][2], attention_spans(tokens, s, masked),
                                              list(layers)) for s in SETUPS]) if attention else ca.empty())
    idx = list(range(tokens.n_t3))
    states, kls = [], []
    for x, ref in PAIRS:
        pair = pl.lit(f"{x}_vs_{ref}")
        for layer in layers:
            rel, cos = state_distances(runs[x][1][layer], runs[ref][1][layer])
            states.append(pl.DataFrame({"t3_index": idx, "rel_l2": rel.numpy(), "cosine": cos.numpy()})
                          .select(session_id=sid, pair=pair, layer=pl.lit(layer, pl.Int32), t3_index="t3_index",
                                  rel_l2="rel_l2", cosine="cosine"))
        kl = next_token_kl(runs[ref][0], runs[x][0]).numpy()
        agree = (runs[ref][0].argmax(-1) == runs[x][0].argmax(-1)).numpy()
        kls.append(pl.DataFrame({"t3_index": idx, "kl": kl, "top1_agrees": agree})
                   .select(session_id=sid, pair=pair, t3_index="t3_index", kl="kl", top1_agrees="top1_agrees"))
    decode = []
    if max_new_tokens:
        cont = greedy_continuations(model, tokens, max_new_tokens, masked)
        for s in ("A", "B", "D"):
            decode.append(dict(session_id=tokens.session_id, setup=s,
                               first_divergence=first_divergence(cont[s], cont["C"]),
                               agree_fraction=float(np.mean([a == c for a, c in zip(cont[s], cont["C"])])),
                               n_new=max_new_tokens, text=model.tokenizer.decode(cont[s]),
                               text_full=model.tokenizer.decode(cont["C"])))
    last = {s: torch.stack([runs[s][1][layer][-1] for layer in layers]) for s in SETUPS}
    return pl.concat(states), pl.concat(kls), decode, last, att


@dataclasses.dataclass
class CompactionResult:
    """The study's tables (module docstring) and its settings."""

    sessions: pl.DataFrame
    states: pl.DataFrame
    next_token: pl.DataFrame
    decode: pl.DataFrame
    probe: pl.DataFrame
    settings: dict
    attention: pl.DataFrame = dataclasses.field(default_factory=ca.empty)

    def summary(self, level: float = 0.95, n_boot: int = 1000) -> pl.DataFrame:
        """Means of the per-session measures with percentile-bootstrap intervals over sessions.

        Columns: metric, pair (``A_vs_C`` … or a setup for decode metrics), layer (null when not per
        layer), estimate, lo, hi, n_sessions. Each session contributes its mean over T3 tokens.
        """
        rows = []

        def add(df: pl.DataFrame, value: str, keys: list[str], metric: str):
            if df.is_empty():
                return
            # sorted by session: the bootstrap resamples rows in order, so the interval is reproducible
            per = df.group_by(["session_id", *keys]).agg(pl.col(value).mean()).drop_nulls(value).sort("session_id")
            for key, g in per.group_by(keys, maintain_order=True):
                est, lo, hi = pr.bootstrap_interval(g[value].to_numpy(), level=level, n_boot=n_boot)
                d = dict(zip(keys, key))
                rows.append(dict(metric=metric, pair=d.get("pair", d.get("setup")), layer=d.get("layer"),
                                 estimate=est, lo=lo, hi=hi, n_sessions=g.height))

        add(self.states, "rel_l2", ["pair", "layer"], "rel_l2")
        add(self.states, "cosine", ["pair", "layer"], "cosine")
        add(self.next_token, "kl", ["pair"], "next_token_kl")
        add(self.next_token, "top1_agrees", ["pair"], "next_token_top1_agrees")
        att = self.attention.rename({"setup": "pair"})
        for col in ("summary_mass", "summary_mass_max", "masked_mass"):
            add(att.drop_nulls(col), col, ["pair", "layer"], f"attention_{col}")
        if not self.decode.is_empty():
            dec = self.decode.with_columns(pl.col("first_divergence").is_not_null().cast(pl.Float64).alias("diverged"))
            add(dec, "diverged", ["setup"], "decode_diverged")
            add(dec, "agree_fraction", ["setup"], "decode_agree_fraction")
        schema = dict(metric=pl.Utf8, pair=pl.Utf8, layer=pl.Int32, estimate=pl.Float64, lo=pl.Float64, hi=pl.Float64,
                      n_sessions=pl.Int32)
        return pl.DataFrame(rows, schema=schema).sort("metric", "pair", "layer")

    def save(self, out: str | pathlib.Path) -> list[pathlib.Path]:
        """Write ``compaction_<table>.parquet`` for every table (schema metadata) and ``settings.json``."""
        out = pathlib.Path(out)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for name in TABLES:
            df = self.summary() if name == "summary" else getattr(self, name)
            path = out / f"compaction_{name}.parquet"
            df.write_parquet(path, metadata=parquet_metadata(f"compaction_{name}"))
            paths.append(path)
        (out / "settings.json").write_text(json.dumps(self.settings, indent=2) + "\n", encoding="utf-8")
        return paths


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
               progress: Callable[[int, int], None] | None = None) -> CompactionResult:
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
    Returns:
        :class:`CompactionResult`.
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
    settings = dict(model=model.describe(), n_sessions=len(sessions), layers=layers, max_new_tokens=n_decode,
                    masked=list(masked), probe=probe, test_fraction=test_fraction, seed=seed,
                    plant_strength=plant_strength, plant_layer=plant_layer, level=level, n_boot=n_boot,
                    attention_mass=("measured: attention rows of T3's queries" if attention else "not measured"))
    return CompactionResult(sess_df, pl.concat(states), pl.concat(kls), pl.DataFrame(decode, schema=dec_schema),
                            probe_df, settings, pl.concat(atts))


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
