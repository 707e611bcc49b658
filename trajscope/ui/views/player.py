"""The step player: play/pause, previous/next, jump to a step, and a readout of where you are.

Everything else in the app follows ``state.step``. The player's slider and
play/pause run in the browser (Panel's ``Player`` widget), so playback stays
smooth while the server only redraws the step cursors.
"""

from __future__ import annotations

import panel as pn
import polars as pl

from trajscope import positions
from trajscope.ui.plots import visible
from trajscope.ui.views._base import StateView
from trajscope.ui.views.keys import ArrowKeys


def describe_step(state) -> str:
    """One line: step s / N, phase, query position and token, the token it produced."""
    traj = state.trajectory
    if traj is None:
        return "No run yet: press **Generate** or open a run directory."
    P, s = traj.prompt_len, state.step
    toks = traj.tokens
    out_pos, q_pos = positions.produced_pos(s, P), positions.query_pos(s, P)
    produced = toks.filter(pl.col("pos") == out_pos)
    prod = f" → produced `{visible(produced['text'][0])}` (pos {out_pos})" if len(produced) else ""
    if s == 0:
        return f"**Step 0 / {state.n_steps - 1} — prefill**: the {P} prompt positions at once{prod}"
    q = toks.filter(pl.col("pos") == q_pos)
    qt = visible(q["text"][0]) if len(q) else "?"
    return f"**Step {s} / {state.n_steps - 1} — decode**: query `{qt}` at pos {q_pos}{prod}"


class StepPlayer(StateView):
    """Play/pause and slider, ◀ Prev / Next ▶ buttons, a step box, arrow keys and a readout."""

    def __panel__(self):
        st = self.state
        player = pn.widgets.Player.from_param(st.param.step, name="Step", interval=300, loop_policy="once",
                                              show_loop_controls=False, show_value=False, width=360, height=70,
                                              scale_buttons=0.8,
                                              visible_buttons=["first", "previous", "pause", "play", "next", "last"])
        prev = pn.widgets.Button(label="◀ Prev", width=80, description="Previous step (← key)")
        nxt = pn.widgets.Button(label="Next ▶", width=80, description="Next step (→ key)", color="primary")
        prev.on_click(lambda e: st.prev())
        nxt.on_click(lambda e: st.next())
        jump = pn.widgets.IntInput.from_param(st.param.step, name="Jump to step", width=110)
        readout = pn.pane.Markdown(pn.bind(lambda *_: describe_step(st), st.param.step, st.param.revision),
                                   css_classes=["ts-step-readout"], margin=(8, 10), sizing_mode="stretch_width")
        keys = ArrowKeys(state=st)
        self._keys = keys
        return pn.Column(
            pn.Row(player, prev, nxt, jump, keys, align="center"),
            readout,
            sizing_mode="stretch_width",
        )
