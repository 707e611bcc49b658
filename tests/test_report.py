"""The comparison report speaks the project's vocabulary: steps are steps, and the app and report agree.

A steered and an unsteered greedy run of the same prompt are identical until the
steering's start step k; step k's distribution is the first one the vector touches,
so the logprob of the token step k produced is the first to differ. The report
must draw that difference at x = k (as the app's next-token plot does), and every
axis labelled "step" must carry step numbers.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

import trajscope as ts
from trajscope.metrics.next_token import step_outputs
from trajscope.reports.comparison import compare

PROMPT = "def parse(text):\n    "
K = 4


@pytest.fixture(scope="module")
def pair(tiny_models):
    model = tiny_models["llama"]
    g = torch.Generator().manual_seed(1)
    vec = ts.SteeringVector(layer=1, direction=torch.randn(model.d_model, generator=g), strength=20.0, start_step=K)
    kw = dict(max_new_tokens=10, stop_at_eos=False, residual_layers=[1])
    return (ts.capture(model, PROMPT, run_id="base", **kw),
            ts.capture(model, PROMPT, run_id="steered", steering=[vec], **kw))


def _lines(fig):
    """{legend label: (x, y)} of a Bokeh figure's line glyphs."""
    out = {}
    for item in fig.legend[0].items:
        for r in item.renderers:
            if type(r.glyph).__name__ == "Line":
                out[item.label["value"]] = (np.asarray(r.data_source.data["x"]), np.asarray(r.data_source.data["y"]))
    return out


def test_logprob_curves_first_differ_at_the_steering_start_step(pair):
    base, steered = pair
    figs = dict((f.title.text, f) for _, f in compare([base, steered]).figures())
    lines = _lines(figs["Logprob of the token each step produced"])
    (xb, yb), (xs, ys) = lines["base"], lines["steered"]
    assert np.array_equal(xb, xs)
    first = int(xb[np.flatnonzero(np.abs(yb - ys) > 1e-6)[0]])
    assert first == K
    # the app's next-token plot reads the same rows
    app = step_outputs(steered.tokens, steered.prompt_len)
    np.testing.assert_allclose(app.drop_nulls("logprob")["logprob"].to_numpy(), ys, rtol=1e-6)


def test_aligned_tokens_and_tokens_table_agree_on_step(pair):
    base, steered = pair
    aligned = compare([base, steered]).tables()["tokens_aligned"]
    assert aligned.columns[0] == "produced_at_step"
    P = base.prompt_len
    tok = steered.tokens
    row = tok.filter(pl.col("pos") == P + K)
    assert row["produced_at_step"][0] == K and row["step"][0] == K + 1  # query step vs producing step
    differs = aligned.filter(pl.col("1: base") != pl.col("2: steered"))["produced_at_step"]
    assert differs.is_empty() or differs.min() >= K


def test_every_step_axis_plots_steps(pair):
    base, steered = pair
    n_steps = base.n_steps
    for section, fig in compare([base, steered]).figures():
        label = fig.xaxis[0].axis_label or ""
        for x, _ in _lines(fig).values():
            if label.startswith("step"):
                assert np.all(x == np.round(x)) and x.min() >= 0 and x.max() <= n_steps, (section, fig.title.text)
            elif label == "position":
                assert x.max() <= len(base.token_ids)
        if section == "residual":
            xs = np.concatenate([x for x, _ in _lines(fig).values()])
            assert xs.min() == 1  # decode steps only: step 1 is the first decode query
