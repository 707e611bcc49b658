"""Features view: SAE features of the run on screen, step by step, and prefill versus decode.

The SAE (default: the prefill-only TopK SAE shipped for the sample model's layer
3) encodes the run's residuals at its layer — kept at capture time with
``residual_layers`` — so any saved run can be looked at with any fitting SAE.
Shown: the top features at the current step (a table; click a row to open the
feature), a feature × step timeline of the most frequent features, the
reconstruction error ‖x − x̂‖² ÷ ‖x‖² over steps with the prefill mean ± s.d. as
a reference band (both with the step cursor and the decode-start line), a
prefill-vs-decode comparison (FVU, L0, top-64 Jaccard and Spearman of feature
frequencies), and the card of the chosen feature (:mod:`.feature_card`): its
label, its density in prefill and decode, its top contexts from the SAE's index.
The plot data and tables come from :mod:`trajscope.ui.feature_plots`; the two figures are built
once per session (:mod:`trajscope.ui.feature_figures`) and a new run only replaces their data.
"""

from __future__ import annotations

import pathlib

import numpy as np
import panel as pn
import param
import polars as pl
import torch

from trajscope import positions
from trajscope.errors import TrajscopeError
from trajscope.escaping import md_text
from trajscope.ui import artefacts
from trajscope.ui.artefacts import FeatureIndex, FeatureLabels, density_table, sample_data_dir
from trajscope.ui import feature_plots as fp
from trajscope.ui.feature_figures import ErrorFigure, TimelineFigure
from trajscope.ui.tables import STYLE as TABLE_STYLE, frame_html
from trajscope.ui.views._base import StateView, in_background, short_run
from trajscope.ui.views._cursor import Cursor, vline
from trajscope.ui.views.feature_card import FeatureCard
from trajscope.ui.views.staged import StagedColumn

SAMPLE_SAE = sample_data_dir() / "saes" / "layer3-prefill-only"
INLINE_SAE_SIZE = 1 << 22  # d_in × d_sae of an SAE that encodes a short run inline (SmolLM2's 576 × 4,608: 16 ms
                           # for a 105-position chat run on the 2-core CPU)


def encode_run(traj, sae, k: int = 16) -> dict:
    """Encode a run's residuals at the SAE's layer.

    Returns:
        ``{"f": [n, d_sae], "rel_err": [n], "features": DataFrame(pos, feature, value) top-k per position}``.
    """
    layer = sae.cfg.layer
    x = traj.residual(layer).float()
    sae.check_input(x, layer)
    with torch.no_grad():
        x_hat, f = sae.reconstruct(x)
    rel = ((x - x_hat).pow(2).sum(-1) / x.pow(2).sum(-1).clamp_min(1e-12)).numpy()
    val, idx = torch.topk(f, min(k, f.shape[1]), dim=-1)
    n = f.shape[0]
    pos = np.repeat(np.arange(n), val.shape[1])
    feats = pl.DataFrame({"pos": pos, "feature": idx.reshape(-1).numpy(), "value": val.reshape(-1).numpy()})
    return {"f": f, "x": x, "x_hat": x_hat, "rel_err": rel, "features": feats.filter(pl.col("value") > 0)}


def comparison_table(enc: dict, prompt_len: int) -> pl.DataFrame:
    """Prefill vs decode: FVU (centred), L0 and cosine per phase, then one row of feature-frequency overlap."""
    from trajscope.metrics.overlap import overlap_summary
    from trajscope.metrics.sae_eval import reconstruction_stats

    rows = []
    parts = {"prefill (pos ≥ 1)": slice(1, prompt_len), "decode": slice(prompt_len, None)}
    for name, sl in parts.items():
        x, x_hat, f = enc["x"][sl], enc["x_hat"][sl], enc["f"][sl]
        if x.shape[0] < 2:
            continue
        st = reconstruction_stats(x, x_hat, f)
        rows.append({"positions": name, "n": int(x.shape[0]), "fvu": st["fvu"], "l0": st["l0"],
                     "cos": st["cos"]})
    out = pl.DataFrame(rows)
    if len(rows) == 2:
        ov = overlap_summary(enc["f"][1:prompt_len], enc["f"][prompt_len:], k=64)
        out = out.with_columns(pl.lit(None, dtype=pl.Float64).alias("jaccard_top64"),
                               pl.lit(None, dtype=pl.Float64).alias("spearman_freq"))
        out = pl.concat([out, pl.DataFrame({"positions": ["prefill vs decode overlap"], "n": [None],
                                            "fvu": [None], "l0": [None], "cos": [None],
                                            "jaccard_top64": [ov.get("jaccard_topk")],
                                            "spearman_freq": [ov.get("spearman")]})], how="vertical_relaxed")
    return out


class FeaturesView(StateView):
    """SAE features of the current run, and the card of the chosen feature."""

    sae_path = param.String(default=str(SAMPLE_SAE), doc="SAE directory in SAELens format (cfg.json + sae_weights.safetensors).")
    message = param.String(default="", doc="Why features are not shown, when they are not.")

    def __init__(self, **params):
        super().__init__(**params)
        self._enc = None
        self._sae = None
        self._sae_loaded_from = None
        self._ticket = 0
        self.card = FeatureCard()
        self.timeline_fig, self.error_fig = TimelineFigure(), ErrorFigure()  # built once; a run replaces their data
        self.cursors: dict[str, Cursor] = {}
        for name, fig in (("timeline", self.timeline_fig), ("error", self.error_fig)):
            c = self.cursors[name] = Cursor([vline()], lambda s: [{"location": float(s)}])
            c.step = self.state.step
            c.attach(fig.figure)
        err = pn.pane.Bokeh(self.error_fig.figure, sizing_mode="stretch_width")
        tl = pn.pane.Bokeh(self.timeline_fig.figure, sizing_mode="stretch_width")
        self._panes = [err, tl]  # pushed to Jupyter when the cursors move
        # what is shown with an encoded run (the figures' classes, for tests and styling, go on wrappers: a
        # Bokeh pane shows its figure as is), and the box that says why there is none
        self.summary_table = pn.pane.HTML("", sizing_mode="stretch_width", css_classes=["ts-sae-summary"],
                                          stylesheets=[TABLE_STYLE], styles={"overflow-x": "auto"})
        self._parts = [pn.Column(err, sizing_mode="stretch_width", css_classes=["ts-sae-error"], visible=False),
                       pn.Column(tl, sizing_mode="stretch_width", css_classes=["ts-sae-timeline"], visible=False),
                       pn.Column(pn.pane.Markdown("**Prefill vs decode** (this run; FVU = E‖x−x̂‖² / E‖x−E[x]‖²)"),
                                 self.summary_table, sizing_mode="stretch_width", visible=False)]
        self.alert = pn.pane.Alert("", alert_type="secondary")
        self.param.watch(self._show, "message")
        self.top_table = pn.widgets.Tabulator(pl.DataFrame({"feature": [], "name": []}).to_pandas(), disabled=True,
                                              show_index=False, selectable=1, height=300, width=460,
                                              layout="fit_columns",  # fit_data re-measured without end (tab at 100% CPU)
                                              hidden_columns=["feature"])
        self._top_rows = pl.DataFrame()
        # what the page shows: a plain table (a Tabulator here kept the browser tab at 100% CPU after a new
        # run, in Chromium 2026-11); features open from the chooser below. ``top_table`` keeps the rows.
        self.top_html = pn.pane.HTML("", sizing_mode="stretch_width", css_classes=["ts-top-features"],
                                     stylesheets=[":host table{border-collapse:collapse;font-size:0.85em}"
                                                  ":host td,:host th{padding:2px 8px;border-bottom:1px solid #ddd}"])
        self.chooser = pn.widgets.Select(label="Feature", options={}, sizing_mode="stretch_width")
        self.top_table.param.watch(self._on_select_row, "selection")
        self._syncing = False
        self.chooser.param.watch(lambda e: None if self._syncing else self.choose(e.new), "value")
        self.card.param.watch(lambda e: self._refresh_chooser(), "feature")
        self.card.param.watch(self._names_changed, "names_version")
        self.state.param.watch(self._recompute, "revision")
        self.state.param.watch(self._move, "step")
        self.param.watch(self._recompute, "sae_path")
        self._recompute()

    # -- the SAE, its labels and index ---------------------------------------------------------
    def _load_sae(self):
        """The SAE at ``sae_path`` (cached) with its labels and index; tells the state its layer."""
        from trajscope.ui.artefacts import SAE
        from trajscope.ui.operator import config

        if self._sae_loaded_from != self.sae_path:
            self._sae, self._sae_loaded_from = None, self.sae_path
            path = config().path(self.sae_path, "SAE directory")  # typed in the browser: inside the data directories
            if not pathlib.Path(path).is_dir():
                self.state.param.update(sae_layer=None, sae_width=None)
                raise TrajscopeError(f"No SAE directory at {self.sae_path}.")
            self._sae = SAE.load(str(path))
            self.state.param.update(sae_layer=int(self._sae.cfg.layer), sae_width=int(self._sae.cfg.d_in))
            self.card.param.update(labels=FeatureLabels(path), index=FeatureIndex.load(path), feature=None)
        if self._sae is None:
            raise TrajscopeError(f"No SAE directory at {self.sae_path}.")
        return self._sae

    def _misfit(self, traj) -> bool:
        """When the SAE does not fit the run's model: switch to a shipped one that does, or say none does
        (and show nothing of the other model's SAE). True when the SAE at ``sae_path`` is not used."""
        if not (pathlib.Path(self.sae_path) / "cfg.json").is_file():
            return False  # not an SAE: loading it says so (a typed path is never swapped for another)
        facts = artefacts.model_facts(traj.meta)
        why = artefacts.sae_misfit(self.sae_path, facts)
        if why is None:
            return False
        other = artefacts.find_sae(facts)
        if other is not None:
            self.sae_path = str(other)  # its watcher recomputes with it
            return True
        self._sae = self._sae_loaded_from = None  # a later fitting path loads afresh
        self.card.param.update(feature=None, index=None, run_density=None)
        self._apply(self._ticket, (None, artefacts.no_sae(facts, why)))
        return True

    def choose(self, feature: int | None) -> None:
        """Show ``feature`` in the card."""
        self.card.feature = None if feature is None else int(feature)

    def _on_select_row(self, event) -> None:
        if event.new and len(self._top_rows) > event.new[0]:
            self.choose(self._top_rows["feature"][event.new[0]])

    def _names(self) -> dict[int, str]:
        return self.card.names()

    def _names_changed(self, *_) -> None:
        self._refresh_chooser()
        self._refresh_top()
        self._draw(error=False)  # the timeline's rows carry the names

    # -- encoding ------------------------------------------------------------------------------
    def _recompute(self, *_) -> None:
        """Encode the run's residuals with the SAE, off the event loop; stale results are dropped."""
        self._ticket += 1
        ticket, traj = self._ticket, self.state.trajectory
        if traj is not None and self._misfit(traj):
            return
        try:
            sae = self._load_sae()
        except TrajscopeError as exc:
            self._apply(ticket, (None, str(exc)))
            return
        if traj is None:
            self._apply(ticket, (None, "No run yet."))
            return
        if self.defer(self._recompute):  # the SAE tab is hidden: encode when it is opened (and show no stale run)
            self._enc, self.message = None, "Encoding the run with the SAE…"
            return
        # being opened, a short run is encoded at once (tens of ms), so the tab is drawn once, with it
        inline = self.opening and short_run(traj) and sae.cfg.d_in * sae.cfg.d_sae <= INLINE_SAE_SIZE
        if not inline:
            self._enc, self.message = None, "Encoding the run with the SAE…"
        in_background(lambda: encode_run(traj, sae), lambda enc: self._apply(ticket, (enc, "")),
                      lambda msg: self._apply(ticket, (None, msg)), what="Encoding the run with the SAE",
                      inline=inline)

    def _apply(self, ticket: int, result) -> None:
        if ticket != self._ticket:
            return
        self._enc, message = result
        if self._enc is not None:
            P = self.state.trajectory.prompt_len
            is_dec = np.arange(self._enc["f"].shape[0]) >= P
            self.card.run_density = density_table(self._enc["f"] > 0, is_dec)
        else:
            self.card.run_density = None
        self._refresh_chooser()
        self._refresh_top()
        if self.card.feature is None and len(self._top_rows):
            self.choose(self._top_rows["feature"][0])
        self._draw()
        if self.message == message:
            self._show()
        else:
            self.message = message  # its watcher shows it

    # -- step-following parts (updated in place) -----------------------------------------------
    def _refresh_chooser(self) -> None:
        """Select options: the run's features by how often they are active (with labels), then the chosen one."""
        opts = {}
        if self._enc is not None:
            freq = self._enc["features"].group_by("feature").len().sort(["len", "feature"], descending=[True, False])
            opts = {self.card.feature_name(f): int(f) for f in freq["feature"]}
        if self.card.feature is not None and self.card.feature not in opts.values():
            opts[self.card.feature_name(self.card.feature)] = self.card.feature
        self._syncing = True
        try:
            self.chooser.options = opts
            self.chooser.value = self.card.feature if self.card.feature in opts.values() else None
        finally:
            self._syncing = False

    def _refresh_top(self) -> None:
        if self._enc is None or self.state.trajectory is None:
            self._top_rows = pl.DataFrame({"feature": [], "name": []})
        else:
            pos = positions.query_pos(self.state.step, self.state.trajectory.prompt_len)
            idx = self.card.index
            self._top_rows = fp.top_features_table(self._enc["features"], pos, self._names(),
                                                   None if idx is None else idx.density)
        self.top_table.selection = []
        shown = fp.display_table(self._top_rows).to_pandas()
        self.top_table.value = shown
        self.top_html.object = shown.drop(columns=["feature"], errors="ignore").to_html(index=False, escape=True,
                                                                                        border=0)

    def _move(self, event) -> None:
        self._refresh_top()
        for c in self.cursors.values():
            c.set_step(event.new, *self._panes)

    # -- layout --------------------------------------------------------------------------------
    def _draw(self, error: bool = True) -> None:
        """Put the encoded run in the figures (the error curve too, unless ``error`` is False); without one,
        the figures keep their last data and are hidden (the box below them says why)."""
        if self._enc is None:
            return
        P = self.state.trajectory.prompt_len
        self.timeline_fig.show(fp.timeline_data(self._enc["features"], P, self._names()))
        if error:
            self.error_fig.show(fp.error_data(self._enc["rel_err"], P))
        for c in self.cursors.values():
            c.set_step(self.state.step, *self._panes)

    def _show(self, *_) -> None:
        """Show the encoded run's figures and prefill-vs-decode table, or the box that says why there are none."""
        enc = self._enc
        if enc is None:
            self.alert.object = md_text(self.message or "No features.")
        else:
            table = comparison_table(enc, self.state.trajectory.prompt_len)
            self.summary_table.param.update(object=frame_html(table), height=48 + 26 * len(table))
        self.alert.visible = enc is None
        for part in self._parts:
            part.visible = enc is not None

    def __panel__(self):
        path = pn.widgets.TextInput.from_param(self.param.sae_path, name="SAE", sizing_mode="stretch_width")
        top = pn.Column(pn.pane.Markdown("**Top features at the current step** (open one with the Feature "
                                         "chooser below)"), self.top_html, sizing_mode="stretch_width")
        card = pn.Column(self.chooser, self.card, sizing_mode="stretch_width",
                         styles={"border-top": "1px solid #ddd"})
        err, tl, summary = self._parts
        # stacked, not side by side: a table beside a responsive plot in one Row made Bokeh re-lay the
        # page out without end at some widths (the browser tab at 100% CPU)
        return StagedColumn(path, top, err, tl, self.alert, summary, card, first=2, sizing_mode="stretch_width")
