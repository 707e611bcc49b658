"""Feature card: what one SAE feature is — its label, its prefill vs decode density, its top contexts.

Part of the SAE features view (:mod:`.features`), which owns one card and sets
its SAE's :class:`~trajscope.features.labels.FeatureLabels` and
:class:`~trajscope.features.index.FeatureIndex` when the SAE loads. The feature
shown is chosen by a click in the top-features table or in the select widget.
The label typed here is saved beside the SAE at once (``labels.json``); when
that directory cannot be written the card says so and keeps the label in memory.
"""

from __future__ import annotations

import panel as pn
import param
import polars as pl

from trajscope.escaping import html_text, md_text
from trajscope.ui.artefacts import FeatureIndex, FeatureLabels
from trajscope.ui.feature_plots import contexts_html, density_text


class FeatureCard(pn.viewable.Viewer):
    """The selected feature: label field, density by phase, top-activating contexts."""

    feature = param.Integer(default=None, allow_None=True, doc="The feature shown (None: none chosen yet).")
    labels = param.ClassSelector(class_=FeatureLabels, doc="Labels of the SAE's features (saved beside the SAE).")
    index = param.ClassSelector(class_=FeatureIndex, allow_None=True, doc="The SAE's shipped feature index, if any.")
    run_density = param.ClassSelector(class_=pl.DataFrame, allow_None=True,
                                      doc="Per-feature active counts by phase in the run on screen.")
    label_text = param.String(default="", doc="The label of the shown feature, as typed (saved when it changes).")
    message = param.String(default="", doc="Whether the last label was saved, and if not, why.")
    names_version = param.Integer(default=0, doc="Bumped when a label changes, so feature names are redrawn.")

    def __init__(self, **params):
        params.setdefault("labels", FeatureLabels(None))
        super().__init__(**params)
        self._syncing = False
        self.param.watch(self._show_label, ["feature", "labels"])
        self.param.watch(self._save_label, "label_text")

    def feature_name(self, feature: int) -> str:
        """``"f123 · label"`` (or ``"f123"``)."""
        return self.labels.name(feature)

    def names(self) -> dict[int, str]:
        """Every labelled feature's display name."""
        return {f: self.labels.name(f) for f in self.labels.labels}

    def _show_label(self, *_) -> None:
        self._syncing = True
        try:
            self.label_text = "" if self.feature is None else self.labels.get(self.feature)
            self.message = self.labels.problem
        finally:
            self._syncing = False

    def _save_label(self, event) -> None:
        if self._syncing or self.feature is None or event.new == self.labels.get(self.feature):
            return
        saved = self.labels.set(self.feature, event.new)
        self.message = f"Saved to {self.labels.path}." if saved else self.labels.problem
        self.names_version += 1

    # -- what the card shows -------------------------------------------------------------------
    def header(self, feature, names_version) -> str:
        return "### Feature" if feature is None else f"### {md_text(self.feature_name(feature))}"

    def density(self, feature, index, run_density) -> str:
        if feature is None:
            return "Choose a feature: click a row of the top-features table, or pick one above."
        row = index.density_of(feature) if index is not None else None
        run = None
        if run_density is not None:
            r = run_density.filter(pl.col("feature") == feature)
            run = r.row(0, named=True) if len(r) else None
        return density_text(row, run)

    def contexts(self, feature, index) -> str:
        if feature is None:
            return ""
        if index is None:
            return "<p>No feature index beside this SAE: build one with <code>trajscope sae-index --sae DIR</code>.</p>"
        n = index.info.get("n_prompts", "?")
        return (f"<p><b>Top-activating contexts</b> over {html_text(n)} prompts of {html_text(index.info.get('prompts', 'the index'))} "
                f"(greedy continuations of {html_text(index.info.get('max_new_tokens', '?'))} tokens; the activating token "
                "is highlighted):</p>" + contexts_html(index.contexts(feature)))

    def _note(self, message) -> pn.viewable.Viewable:
        if not message:
            return pn.Spacer(height=0)
        kind = "success" if message.startswith("Saved") else "warning"
        return pn.pane.Alert(md_text(message), alert_type=kind, margin=(0, 10))

    def __panel__(self):
        p = self.param
        label = pn.widgets.TextInput.from_param(p.label_text, name="Label (press Enter to save)",
                                                placeholder="what this feature seems to detect",
                                                sizing_mode="stretch_width")
        return pn.Column(pn.pane.Markdown(pn.bind(self.header, p.feature, p.names_version)), label,
                         pn.bind(self._note, p.message),
                         pn.pane.Markdown(pn.bind(self.density, p.feature, p.index, p.run_density)),
                         pn.pane.HTML(pn.bind(self.contexts, p.feature, p.index), sizing_mode="stretch_width"),
                         sizing_mode="stretch_width")
