"""The token strip keeps the current step's line in view on runs longer than the strip."""

import polars as pl

from trajscope.ui import plots
from trajscope.ui.step_figures import STRIP_LINES, TokenStripFigure
from trajscope.ui.state import AppState
from trajscope.ui.views.tokens import TokenStrip


def _tokens(n: int) -> pl.DataFrame:
    return pl.DataFrame({"pos": range(n), "step": [max(0, p - 3) for p in range(n)],
                         "phase": ["prefill"] * 4 + ["decode"] * (n - 4), "text": ["word\n"] * n})


def test_follow_pans_to_a_line_below_the_strip_and_stays_put_while_it_is_visible():
    fig = TokenStripFigure()
    fig.show(plots.token_layout(_tokens(40)), 4, "x", ["#000000", "#ffffff"])
    r = fig.figure.y_range
    assert fig.lines == STRIP_LINES and r.end > 0 > r.start > -STRIP_LINES - 1  # the first lines
    fig.follow(30)  # a token on line 30 spans y ∈ [−31, −30]
    assert r.start <= -31 and r.end >= -30 and r.end - r.start <= STRIP_LINES + 0.2
    before = (r.start, r.end)
    fig.follow(29)
    assert (r.start, r.end) == before
    fig.follow(0)
    assert r.end >= 0 and r.start <= -1


def test_the_strip_follows_the_step(short_run):
    st = AppState(trajectory=short_run)
    strip = TokenStrip(state=st)
    strip.layout_df = plots.token_layout(_tokens(40))  # one token a line: 40 lines
    strip.prompt_len = 4
    st.go(st.n_steps - 1)
    line = 4 + st.step - 1  # the query of step s sits at pos P + s − 1, one line each
    r = strip.strip.figure.y_range
    assert r.start <= -line - 1 and r.end >= -line
