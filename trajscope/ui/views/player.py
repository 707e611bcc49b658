"""The step bar: the player, a step box kept in sync, the arrow keys, and a readout of where you are.

Everything else in the app follows ``state.step``. The player's slider and
play/pause run in the browser (Panel's ``Player`` widget), so playback stays
smooth while the server only redraws the step cursors.
"""

from __future__ import annotations

import panel as pn
import polars as pl

from trajscope import positions
from trajscope.escaping import md_text
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
    prod = f" → produced <code>{md_text(visible(produced['text'][0]))}</code> (pos {out_pos})" if len(produced) else ""
    if s == 0:
        return f"**Step 0 / {state.n_steps - 1} — prefill**: the {P} prompt positions at once{prod}"
    q = toks.filter(pl.col("pos") == q_pos)
    qt = md_text(visible(q["text"][0])) if len(q) else "?"
    return f"**Step {s} / {state.n_steps - 1} — decode**: query <code>{qt}</code> at pos {q_pos}{prod}"


def check_step(text_value, n_steps: int) -> tuple[int | None, str]:
    """Validate a step typed in the step box: ``(step, "")`` or ``(None, why not)``."""
    if n_steps <= 0:
        return None, "No run yet: press Generate or open a run."
    try:
        step = int(text_value)
    except (TypeError, ValueError):
        return None, f"Type a step number from 0 to {n_steps - 1}."
    if not 0 <= step < n_steps:
        return None, f"Step {step} is outside this run: it has steps 0 to {n_steps - 1}."
    return step, ""


class StepPlayer(StateView):
    """The one step control: player (first, previous, play/pause, next, last, slider) plus a step box.

    The ← → keys (:class:`~trajscope.ui.views.keys.ArrowKeys`) and clicks on tokens and curves move
    the same ``state.step``; the step box always shows it, and says so when a typed step is outside
    the run instead of silently ignoring it.
    """

    def _box_changed(self, event) -> None:
        st = self.state
        if event.new == st.step and st.n_steps:  # the box back at the step on screen (below): the note stays
            return
        step, why = check_step(event.new, st.n_steps)
        self._box_note.object = why
        if step is None:
            self._box.value = st.step  # show the step actually on screen; the note says why it went back
        else:
            st.go(step)

    def _step_changed(self, *_) -> None:
        self._box_note.object = ""
        if self._box.value != self.state.step:
            self._box.value = self.state.step

    def __panel__(self):
        st = self.state
        player = pn.widgets.Player.from_param(st.param.step, name="Step", interval=300, loop_policy="once",
                                              show_loop_controls=False, show_value=False, width=360, height=70,
                                              scale_buttons=0.8, css_classes=["ts-player"],
                                              visible_buttons=["first", "previous", "pause", "play", "next", "last"])
        self._box = pn.widgets.IntInput(label="Step", value=st.step, width=100, css_classes=["ts-step-box"],
                                        description="Type a step and press Enter (0 = prefill).")
        self._box_note = pn.pane.Markdown("", css_classes=["ts-step-note"], styles={"color": "#b02a37"},
                                          margin=(18, 5, 0, 5), width=320, height=30)
        self._box.param.watch(self._box_changed, "value")
        st.param.watch(self._step_changed, ["step", "revision"])
        readout = pn.pane.Markdown(pn.bind(lambda *_: describe_step(st), st.param.step, st.param.revision),
                                   css_classes=["ts-step-readout"], margin=(0, 10, 5, 10),
                                   sizing_mode="stretch_width", min_height=30)
        keys = ArrowKeys(state=st)
        self._keys = keys
        return pn.Column(pn.Row(player, self._box, self._box_note, keys, align="center"), readout,
                         sizing_mode="stretch_width")
