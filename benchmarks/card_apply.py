"""Micro-benchmark: the server's share of putting a new run on screen, for the SAE features, Drift and Attention cards.

When a card's analysis of a new run is done, the card puts it on screen on the event loop
(``FeaturesView._apply``, ``DriftView._apply``; the Attention card on the state's new ``revision``): the
card's figures get the run's data there, before anything reaches the browser. This times that step alone, on the shipped sample run
(``sample_data/runs/demo``) with the shipped SAE and profile, each view attached to a Bokeh document as a
served page's would be, its analysis computed beforehand (SAE encoding, drift scoring). Prints each
repetition's time and the median (Attention: the state is given the run again,
``AppState.set_trajectory``, with only that card watching it; the time includes the run's
``step_queries`` table, which the card's grid and top keys read), and with ``--profile`` the cProfile of one more repetition.

Run: ``python benchmarks/card_apply.py [--reps 5] [--profile]``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import panel as pn
from bokeh.document import Document

import trajscope as ts
from trajscope.studies.drift.card import DriftView
from trajscope.ui.state import AppState
from trajscope.ui.views.attention import AttentionView
from trajscope.ui.views.features import FeaturesView, encode_run


def attached(view) -> None:
    doc = Document()
    doc.add_root(pn.panel(view).get_root(doc))


def features_apply(traj, state):
    view = FeaturesView(state=state)
    attached(view)
    enc = encode_run(traj, view._load_sae())

    def once() -> float:
        view._apply(view._ticket, (None, "cleared"))  # the card without a result, as a new run leaves it
        t0 = time.perf_counter()
        view._apply(view._ticket, (enc, ""))
        return time.perf_counter() - t0

    return once


def drift_apply(traj, state):
    view = DriftView(state=state)
    attached(view)
    s = view.settings
    res = s.score(traj, s.profile())

    def once() -> float:
        s.show(None, "cleared")
        t0 = time.perf_counter()
        view._apply(view._ticket, traj, res)
        return time.perf_counter() - t0

    return once


def attention_apply(traj, state):
    state = AppState()  # its own state: the other cards would redraw on the new revision too
    state.set_trajectory(traj, step=0)
    view = AttentionView(state=state)
    attached(view)

    def once() -> float:
        t0 = time.perf_counter()
        state.set_trajectory(traj, step=0)
        return time.perf_counter() - t0

    return once


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    traj = ts.Trajectory.load(str(ts.model.sample_data_dir() / "runs" / "demo"))
    state = AppState()
    state.trajectory = traj
    for name, make in (("SAE features", features_apply), ("Drift", drift_apply),
                       ("Attention", attention_apply)):
        once = make(traj, state)
        once()  # warm-up
        times = [once() for _ in range(args.reps)]
        print(f"{name}: putting the result on screen (server side) {statistics.median(times) * 1e3:.0f} ms "
              f"(median of {args.reps}: {', '.join(f'{t * 1e3:.0f}' for t in times)})")
        if args.profile:
            pr = cProfile.Profile()
            pr.runcall(once)
            pstats.Stats(pr).sort_stats("cumulative").print_stats(15)


if __name__ == "__main__":
    main()
