"""TrajScope: the whole app in one Viewer (``ts.TrajScope(model="sample")``).

Layout: controls (model, prompt, Generate/Stop, open) on the left; on the right
the step bar and the token strip, always visible, then the analyses in tabs
(Overview · Attention · SAE features, then each registered study's card in its ``order`` — Drift,
Steering, Eviction, Compaction … — and Export), all following one
:class:`~trajscope.ui.state.AppState`; a registered study's card is ``app.study_cards[name]``.
Each instance has its own state, so every browser session of ``panel serve`` (and every notebook
cell) is independent; loaded models are shared through :mod:`trajscope.ui.runner`.

In Jupyter, displaying a ``TrajScope`` loads the Panel extension first, so no
``pn.extension()`` call is needed.
"""

from __future__ import annotations

import os
import pathlib

import panel as pn
import param
from panel.io.resources import CDN_DIST
from panel.theme import Design, Fast

from trajscope.studies.registry import cards as registered_cards
from trajscope.trajectory import Trajectory
from trajscope.ui.state import AppState
from trajscope.ui.views._base import StateView, provenance_line, served
from trajscope.ui.views.attention import AttentionView
from trajscope.ui.views.controls import Controls
from trajscope.ui.views.export import ExportView
from trajscope.ui.views.features import FeaturesView
from trajscope.ui.views.live import LiveView
from trajscope.ui.views.player import StepPlayer
from trajscope.ui.views.staged import StagedColumn
from trajscope.ui.views.telemetry import TelemetryView
from trajscope.ui.views.tokens import TokenStrip
from trajscope.ui.views import css_reads, late_children, no_mathjax, unlocked

FONT = "Liberation Sans, Arial, Helvetica, sans-serif"  # installed fonts; no web font
TITLE = "trajscope — does decode still look like prefill?"
INTRO = ("Step through a model's generation one decode step at a time. **Step 0** is the prefill pass over the "
         "prompt; **step s** is the decode pass whose query is the token at position P+s−1. Step with the player, the "
         "← → keys or the step box; click a token or a curve to jump there.")


class LocalFonts(Fast):
    """Panel's Fast design without its web font (Open Sans from Google Fonts): the page uses installed fonts."""

    # the same resources as Fast, its own files named by their bundled path (they would resolve under this class's name)
    _resources = {**{k: v for k, v in Fast._resources.items() if k != "font"},
                  "js_modules": {k: v if "//" in v else f"{CDN_DIST}bundled/fast/{v}"
                                 for k, v in Fast._resources["js_modules"].items()}}


class Page(pn.template.FastListTemplate):
    """Panel's FastListTemplate in the :class:`LocalFonts` design: the page loads nothing from outside its server."""

    design = param.ClassSelector(class_=Design, default=LocalFonts, is_instance=False, instantiate=False)


def ensure_extension() -> None:
    """Load Panel's notebook extension (with notifications) once, if not loaded yet.

    Resources are inlined into the notebook (BokehJS and Panel's bundle, a few MB) unless
    ``TRAJSCOPE_CDN=1``: a notebook opened offline, or its HTML export, then renders without
    fetching anything.
    """
    if not pn.extension._loaded:
        pn.extension("tabulator", notifications=True, inline=os.environ.get("TRAJSCOPE_CDN") != "1")


class CardTabs(pn.Tabs):
    """``pn.Tabs`` that call ``before_show()`` when the active tab changes, before drawing the newly active one.

    The app tells its views there which one is shown (:attr:`StateView.shown`), so that a card whose
    deferred analysis is short has its result when its models are built and is drawn once. (A param
    watcher cannot run before the Tabs' own: user watchers may not take a negative precedence.)
    """

    before_show = None

    def _update_active(self, *events):
        if self.before_show is not None and any(e.name == "active" for e in events):
            self.before_show()
        super()._update_active(*events)


class TrajScope(StateView):
    """The trajscope app.

    Args:
        model: model source for Generate (``"sample"``, a directory, a cached HF name).
        trajectory: a :class:`~trajscope.Trajectory` to show, or a path to a run directory.
        prompt, max_new_tokens: initial generation settings.
        autostart: when no run is given, generate one as soon as the page shows it.
    """

    cache_layout = False  # __panel__ registers the page-load callback of each new session
    model = param.String(default="sample", doc="Model source used by Generate.")
    autostart = param.Boolean(default=False, doc="Generate a first run when the app is shown without one.")

    def __init__(self, model: str = "sample", trajectory: Trajectory | str | os.PathLike | None = None, **params):
        unlocked.install()  # a browser event handled without the document lock still redraws the figures
        state_params = {k: params.pop(k) for k in list(params) if k in AppState.param and k != "name"}
        if isinstance(trajectory, (str, os.PathLike)):
            trajectory = Trajectory.load(trajectory)
        if params.get("state") is None:
            params["state"] = AppState(model_source=model, trusted_models=[model], **state_params)
        super().__init__(model=model, **params)
        if trajectory is not None:
            self.state.set_trajectory(trajectory, step=0)
        self.controls = Controls(state=self.state)
        self.player = StepPlayer(state=self.state)
        self.tokens = TokenStrip(state=self.state)
        self.attention = AttentionView(state=self.state)
        self.telemetry = TelemetryView(state=self.state)
        self.export = ExportView(state=self.state)
        self.features = FeaturesView(state=self.state)
        self.live = LiveView(state=self.state)
        # one list of (tab title, view), built once: the core cards, each registered study's card, then Export
        self._cards = [("Overview", self.telemetry), ("Attention", self.attention), ("SAE features", self.features)]
        # each registered study's card, by study name (app.study_cards["drift"]), in tab order
        self.study_cards = {study.name: study.card(self.state) for study in registered_cards()}
        self._cards += [(study.tab_title, self.study_cards[study.name]) for study in registered_cards()]
        self._cards.append(("Export", self.export))
        self._provenance = [provenance_line(self.state) for _ in self._cards]  # one per card
        self.controls.on_start.append(self.live.reset)
        self.controls.listeners.append(self.live.append)
        self._started = False

    def release(self) -> None:
        """Free what this session holds (its browser has gone): stop its generation, drop its runs."""
        if self.controls.job is not None:
            self.controls.job.stop()
        for view in self.study_cards.values():  # a card that holds results of this session's runs lets them go
            if callable(getattr(view, "release", None)):
                view.release()
        self.state.trajectory = None

    def _autostart(self) -> None:
        """Load the model now, and start the first run when ``autostart`` and no run is shown."""
        self.controls.warm_up()
        if self.autostart and not self._started and self.state.trajectory is None:
            self._started = True
            self.controls.generate()

    def sidebar(self) -> pn.Column:
        """Model, prompt, settings, Generate / Stop, open a run."""
        return pn.Column(pn.pane.Markdown(INTRO, styles={"font-size": "0.85em", "color": "#555"}), self.controls,
                         sizing_mode="stretch_width")

    def main(self) -> pn.Column:
        """Step bar and token strip (always visible), then the analyses in tabs.

        Tabs are rendered when first shown (``dynamic``): a new run redraws only the tab on screen.
        """
        return pn.Column(*self._main_parts(), sizing_mode="stretch_width")

    def _main_parts(self) -> tuple[pn.Column, pn.Tabs]:
        """:meth:`main` in two parts: the step bar and token strip, and the tabs (the page makes each a Bokeh
        root of its own, see :meth:`template`)."""
        card = dict(sizing_mode="stretch_width", collapsible=False, margin=(5, 5))
        named = self._cards
        tabs = CardTabs(  # each card opens with the run and model its results belong to
            *[(name, pn.Column(self._provenance[i], view, sizing_mode="stretch_width"))
              for i, (name, view) in enumerate(named)],
            dynamic=True, sizing_mode="stretch_width", css_classes=["ts-tabs"])
        self.tabs = tabs
        views = [view for _, view in named]

        def on_tab(*_):  # hidden tabs defer their analyses of a new run until they are opened
            for i, view in enumerate(views):
                if "shown" in getattr(view, "param", {}):
                    view.shown = i == tabs.active

        tabs.before_show = on_tab
        on_tab()
        return StagedColumn(pn.Card(self.player, self.live, title="Step", **card),
                            pn.Card(self.tokens, title="Tokens", **card), sizing_mode="stretch_width"), tabs

    def template(self) -> Page:
        """The app as a page (what ``panel serve apps/trajscope.py`` shows).

        The page request only sends a light shell; the views are drawn once the browser has connected
        (``pn.state.onload``), so a request its client abandons costs the server almost nothing
        (drawing the views takes about a second of server time; the shell about a tenth).

        The step bar with the token strip and the tabs are two Bokeh roots: BokehJS lays out and repaints
        every plot of a root when anything in it changes, so a card drawing its result does not also
        repaint the step bar and the token strip.
        """
        side = pn.Column(sizing_mode="stretch_width")
        main = pn.Column(pn.pane.Markdown("Loading trajscope…", css_classes=["ts-loading"]), sizing_mode="stretch_width")
        cards = pn.Column(sizing_mode="stretch_width")

        def draw() -> None:
            self._autostart()  # first: Generate and Stop are made in the running state (see Controls.__panel__)
            side[:] = [self.sidebar()]
            top, tabs = self._main_parts()
            main[:] = [top]
            cards[:] = [tabs]

        tpl = Page(title=TITLE, sidebar=[side], main=[main, cards], font=FONT,
                                           sidebar_width=340, accent="#1f77b4", theme_toggle=False,
                                           main_max_width="1600px",
                                           # Panel's busy spinner is one shared model synced through a global
                                           # list: a busy change in one session writes into every other
                                           # session's document without its lock (Bokeh RuntimeError
                                           # "_pending_writes should be non-None…"). The app shows its own status.
                                           busy_indicator=None)
        tpl._trajscope = self  # the session's app, for tests and scripts that serve the page
        page_doc = pn.state.curdoc if served(pn.state.curdoc) else None  # None: a notebook, or a test without a server
        css_reads.install(page_doc)  # css_reads.py: BokehJS's CSS-variable reads skipped
        no_mathjax.install(page_doc)  # no_mathjax.py: no MathJax bundle on the page
        late_children.install(page_doc)  # late_children.py: a part sent while its column is being built is drawn
        pn.state.onload(draw)
        return tpl

    def __panel__(self):
        if served(pn.state.curdoc):
            pn.state.onload(self._autostart)
        # in a notebook (or any embedding) the plots get the full width: the controls sit above them, folded
        return pn.Column(pn.Card(self.sidebar(), title="Model, prompt & runs", collapsed=True,
                                 sizing_mode="stretch_width", css_classes=["ts-controls-card"]),
                         self.main(), sizing_mode="stretch_width")

    def _repr_mimebundle_(self, include=None, exclude=None):
        ensure_extension()
        return super()._repr_mimebundle_(include, exclude)


def default_page(run_dir: str | os.PathLike | None = None, model: str = "sample", **params) -> Page:
    """The page ``panel serve apps/trajscope.py`` shows, for one session.

    Opens ``run_dir`` when it holds a run (default: ``sample_data/runs/demo`` on the sample model);
    without one, the page captures a short run of the demo prompt on ``model`` as soon as it is shown.
    """
    from trajscope.ui import operator
    from trajscope.ui.artefacts import sample_data_dir

    if not operator.SESSIONS.enter():  # the operator's limit on concurrent sessions
        return Page(title=TITLE, font=FONT, main=[pn.pane.Alert(
            f"This trajscope server is full ({operator.config().max_sessions} sessions are open). Try again in a "
            "minute, or ask its operator to raise --max-sessions.", alert_type="warning")], busy_indicator=None)
    demo = sample_data_dir() / "runs" / "demo"  # a run of the sample model: not the first page of another
    run_dir = pathlib.Path(run_dir) if run_dir else (demo if model == "sample" else demo / "-")
    has_run = (run_dir / "meta.json").exists()
    settings = {"max_new_tokens": 64 if has_run else 24, "autostart": not has_run, **params}
    app = TrajScope(model=model, trajectory=run_dir if has_run else None, **settings)
    if has_run:
        app.state.run_path = str(run_dir)
    if served(pn.state.curdoc):
        pn.state.on_session_destroyed(lambda ctx: (app.release(), operator.SESSIONS.leave()))
    else:
        operator.SESSIONS.leave()  # not a served session (a test or a script building the page): not counted
    return app.template()
