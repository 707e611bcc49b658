"""Features view: SAE features of the run on screen, step by step, and prefill versus decode.

The SAE (default: the prefill-only TopK SAE shipped for the sample model's layer
3) encodes the run's residuals at its layer — kept at capture time with
``residual_layers`` — so any saved run can be looked at with any fitting SAE.
Shown: the top features at the current step, a feature × position timeline of
the most frequent features, the reconstruction error ‖x − x̂‖² ÷ ‖x‖² over
positions with the prefill mean ± s.d. as a reference band, and a prefill-vs-
decode comparison (FVU, L0, top-64 Jaccard and Spearman of feature frequencies).
"""

from __future__ import annotations

import pathlib

import holoviews as hv
import numpy as np
import panel as pn
import param
import polars as pl
import torch

from trajscope import positions
from trajscope.errors import TrajscopeError
from trajscope.model import sample_data_dir
from trajscope.ui.plots import CURSOR_COLOR
from trajscope.ui.views._base import StateView, in_background

SAMPLE_SAE = sample_data_dir() / "saes" / "layer3-prefill-only"


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


def top_features_plot(features: pl.DataFrame, pos: int, step: int) -> hv.Bars:
    """Bars of the active features at ``pos`` (the current step's query)."""
    sub = features.filter(pl.col("pos") == pos).sort("value", descending=True).head(16)
    return hv.Bars([(str(f), v) for f, v in zip(sub["feature"], sub["value"])], "feature", "activation").opts(
        responsive=True, height=240, color="#1f77b4", tools=["hover"], xrotation=45, shared_axes=False,
        title=f"Top SAE features at step {step} (query pos {pos})")


def timeline_plot(features: pl.DataFrame, prompt_len: int, n_features: int = 20) -> hv.Overlay:
    """Heatmap feature × position of the ``n_features`` most frequently active features."""
    top = features.group_by("feature").len().sort("len", descending=True).head(n_features)["feature"]
    sub = features.filter(pl.col("feature").is_in(top.implode())).with_columns(pl.col("feature").cast(pl.String))
    hm = hv.HeatMap(sub.select("pos", "feature", "value").to_pandas(), ["pos", "feature"], "value").opts(
        cmap="magma", colorbar=True, responsive=True, height=380, tools=["hover"], xlabel="position", shared_axes=False,
        ylabel="feature", title=f"Feature timeline — the {len(top)} most frequent features (dashed: decode starts)")
    return hm * hv.VLine(prompt_len - 0.5).opts(color="white", line_dash="dashed")


def error_plot(rel_err: np.ndarray, prompt_len: int, pos: int) -> hv.Overlay:
    """Reconstruction error by position, prefill mean ± s.d. band (positions ≥ 1), current query marked."""
    x = np.arange(len(rel_err))
    ref = rel_err[1:prompt_len] if prompt_len > 2 else rel_err[:prompt_len]
    m, s = float(ref.mean()), float(ref.std())
    band = hv.HSpan(m - s, m + s).opts(color="#2ca02c", alpha=0.15)
    curve = hv.Curve((x, rel_err), "position", "relative error").opts(color="#1f77b4", tools=["hover"])
    return (band * hv.HLine(m).opts(color="#2ca02c", line_dash="dashed") * curve
            * hv.VLine(prompt_len - 0.5).opts(color="#6c757d", line_dash="dashed")
            * hv.VLine(pos).opts(color=CURSOR_COLOR)).opts(
        responsive=True, height=240, ylabel="‖x − x̂‖² ÷ ‖x‖²", xlabel="position", shared_axes=False,
        title="SAE reconstruction error by position (green: prefill mean ± s.d.)")


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
    """SAE features of the current run."""

    sae_path = param.String(default=str(SAMPLE_SAE), doc="SAE directory in SAELens format (cfg.json + sae_weights.safetensors).")
    message = param.String(default="", doc="Why features are not shown, when they are not.")

    def __init__(self, **params):
        super().__init__(**params)
        self._enc = None
        self._sae = None
        self._sae_loaded_from = None
        self._ticket = 0
        self.state.param.watch(self._recompute, "revision")
        self.param.watch(self._recompute, "sae_path")
        self._recompute()

    def _load_sae(self):
        """The SAE at ``sae_path`` (cached); tells the state its layer so Generate keeps those residuals."""
        from trajscope.sae.model import SAE

        if self._sae_loaded_from != self.sae_path:
            self._sae, self._sae_loaded_from = None, self.sae_path
            if not pathlib.Path(self.sae_path).is_dir():
                self.state.sae_layer = None
                raise TrajscopeError(f"No SAE directory at {self.sae_path}.")
            self._sae = SAE.load(self.sae_path)
            self.state.sae_layer = int(self._sae.cfg.layer)
        if self._sae is None:
            raise TrajscopeError(f"No SAE directory at {self.sae_path}.")
        return self._sae

    def _recompute(self, *_) -> None:
        """Encode the run's residuals with the SAE, off the event loop; stale results are dropped."""
        self._ticket += 1
        ticket, traj = self._ticket, self.state.trajectory
        try:
            sae = self._load_sae()
        except TrajscopeError as exc:
            self._apply(ticket, (None, str(exc)))
            return
        if traj is None:
            self._apply(ticket, (None, "No run yet."))
            return
        self._enc, self.message = None, "Encoding the run with the SAE…"

        def work():
            try:
                return encode_run(traj, sae), ""
            except TrajscopeError as exc:
                return None, str(exc)

        in_background(work, lambda res: self._apply(ticket, res))

    def _apply(self, ticket: int, result) -> None:
        if ticket != self._ticket:
            return
        self._enc, self.message = result
        self.param.trigger("message")

    def _top(self, step, message):
        if self._enc is None:
            return pn.pane.Alert(self.message or "No features.", alert_type="secondary")
        P = self.state.trajectory.prompt_len
        pos = positions.query_pos(step, P)
        return pn.Row(pn.pane.HoloViews(top_features_plot(self._enc["features"], pos, step), sizing_mode="stretch_width"),
                      pn.pane.HoloViews(error_plot(self._enc["rel_err"], P, pos), sizing_mode="stretch_width"),
                      sizing_mode="stretch_width")

    def _whole(self, message):
        if self._enc is None:
            return pn.Column()
        P = self.state.trajectory.prompt_len
        table = comparison_table(self._enc, P)
        return pn.Column(pn.pane.HoloViews(timeline_plot(self._enc["features"], P), sizing_mode="stretch_width"),
                         pn.pane.Markdown("**Prefill vs decode** (this run; FVU = E‖x−x̂‖² / E‖x−E[x]‖²)"),
                         pn.widgets.Tabulator(table.to_pandas(), disabled=True, show_index=False, height=110,
                                              sizing_mode="stretch_width"), sizing_mode="stretch_width")

    def __panel__(self):
        path = pn.widgets.TextInput.from_param(self.param.sae_path, name="SAE", sizing_mode="stretch_width")
        return pn.Column(path, pn.bind(self._top, self.state.param.step, self.param.message),
                         pn.bind(self._whole, self.param.message), sizing_mode="stretch_width")
