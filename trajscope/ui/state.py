"""AppState: everything the trajscope app shows, as ``param`` parameters (no Panel here).

One :class:`AppState` per browser session (or notebook cell). Views read it and
write it through widgets; plots are recomputed from it. The state knows the
vocabulary of DESIGN.md: the player moves over *steps* 0..n_steps−1, step 0 is
the prefill pass and step s ≥ 1 is the decode pass whose query is the token at
``pos = P + s − 1``. A token at position ``pos`` is therefore reached at step
``max(0, pos − P + 1)``.

Also here: the generation settings a user types (model source, prompt, sampling,
layers to keep) plus the layers the cards on screen need, frozen into a
:class:`~trajscope.ui.plan.CapturePlan` when Generate is pressed, and the
status line / error message that views show as notifications. The NDIF API key
lives only in this object's memory: it is never written into a run's meta, an
export or a log line.
"""

from __future__ import annotations

import param
import polars as pl

from trajscope import positions
from trajscope.escaping import md_text
from trajscope.capture.config import CaptureConfig
from trajscope.errors import TrajscopeError
from trajscope.metrics.attention import TELEMETRY_FIELDS, step_queries
from trajscope.trajectory import Trajectory
from trajscope.ui.plan import CapturePlan

DEMO_PROMPT = "def fibonacci(n):\n    "
MEAN = -1  # head index meaning "mean over heads"
MAX_TEMPERATURE = 5.0  # the sampling temperature the app accepts, at most
TOKEN_METRICS = {"next-token entropy (nats)": "entropy", "logprob of the token": "logprob",
                 "residual drift (z vs prefill)": "drift", "chat turn (segment)": "segment"}
_NOT_METRICS = {"pos", "step", "token_id", "entropy", "logprob"}
COLUMN_NAMES = {"drift_score_max": "drift score (max over layers)",
                "drift_flagged_layers": "layers over their drift threshold", "produced_at_step": "step that produced it"}
GRID_STATS = {"attention entropy (nats)": "entropy", "attention entropy / log(#keys)": "entropy_norm",
              "prefix (prompt) mass": "prefix_mass", "generated mass": "generated_mass",
              "sink mass (pos 0)": "sink_mass", "sink mass (pos 0–3)": "sink4_mass", "self mass": "self_mass"}


def token_metric_choices(tokens: pl.DataFrame) -> dict[str, str]:
    """Token-colouring metrics for a ``tokens`` table: the built-in ones plus any extra numeric column.

    Extra per-token columns (e.g. an SAE reconstruction error added by a later analysis) appear
    under their column name.
    """
    extra = {COLUMN_NAMES.get(c, c.replace("_", " ")): c for c, t in tokens.schema.items()
             if t.is_numeric() and c not in _NOT_METRICS}
    return {**TOKEN_METRICS, **extra}


def parse_layers(text: str, n_layers: int | None = None, what: str = "layers") -> str | list[int] | None:
    """Parse a "keep … of layers" field: ``"all"``, ``"none"``/empty, or comma-separated indices.

    Raises:
        TrajscopeError: for anything else, or an index outside ``0..n_layers-1`` when known.
    """
    text = (text or "").strip().lower()
    if text in ("", "none"):
        return None
    if text == "all":
        return "all"
    try:
        layers = sorted({int(t) for t in text.replace(" ", ",").split(",") if t})
    except ValueError:
        raise TrajscopeError(f"Keep {what} of layers: type 'all', 'none' or indices like '0,3', not '{text}'.") from None
    if n_layers is not None and any(not 0 <= layer < n_layers for layer in layers):
        raise TrajscopeError(f"Keep {what} of layers: the model has layers 0..{n_layers - 1}, not {layers}.")
    return layers


class AppState(param.Parameterized):
    """What the app shows and the settings of the next generation."""

    # -- the run and the cursor ---------------------------------------------------------------
    trajectory = param.ClassSelector(class_=Trajectory, allow_None=True, doc="The run on screen (None before the first one).")
    token_extra = param.ClassSelector(class_=pl.DataFrame, allow_None=True, doc="Per-token columns that analyses "
                                      "derived for the run on screen (``pos`` + columns), joined onto its tokens for "
                                      "the token strip; the shared Trajectory is never modified.")
    revision = param.Integer(default=0, doc="Bumped whenever a new trajectory is set; plots that depend on the whole run watch it.")
    step = param.Integer(default=0, bounds=(0, 0), doc="Current step: 0 = prefill, s ≥ 1 = decode step s (query at pos P+s−1).")

    # -- what to look at ---------------------------------------------------------------------
    layer = param.Selector(default=0, objects=[0], doc="Layer shown in the attention heatmap and the telemetry.")
    head = param.Selector(default=MEAN, objects={"mean over heads": MEAN}, doc="Head shown (or the mean over heads).")
    grid_stat = param.Selector(default="entropy_norm", objects={k: v for k, v in GRID_STATS.items() if v in TELEMETRY_FIELDS},
                               doc="Statistic shown in the layer × head grid at the current step.")
    telemetry_average = param.Boolean(default=False, doc="Telemetry averaged over all layers and heads instead of the selection.")
    token_metric = param.Selector(default="entropy", objects=dict(TOKEN_METRICS), doc="Per-token metric that colours the token strip.")

    # -- generation settings -------------------------------------------------------------------
    trusted_models = param.List(default=[], precedence=-1, doc="Models the app was started with (chosen by the "
                                "operator in code, not typed in the browser): allowed besides the server's list.")
    model_source = param.String(default="sample", doc="'sample', a local model directory, a cached Hugging Face name, or an NDIF model name.")
    remote = param.Boolean(default=False, doc="Run on NDIF (needs an API key).")
    ndif_api_key = param.String(default="", doc="NDIF API key; kept in memory only, never saved, exported or logged.")
    prompt = param.String(default=DEMO_PROMPT, doc="Prompt text to continue.")
    chat = param.Boolean(default=True, doc="Send the prompt as one user message through the model's chat template "
                         "when it has one (an instruct model such as SmolLM2 answers a bare prompt with end-of-turn); "
                         "models without a template continue the text as it is.")
    max_new_tokens = param.Integer(default=64, doc="Decode steps to run at most (≥ 1; checked when Generate is pressed).")
    temperature = param.Number(default=0.0, doc="0 = greedy; > 0 samples with this temperature (at most 5; checked "
                               "when Generate is pressed: a bound here would make the field drop an out-of-range value "
                               "unsaid).")
    seed = param.Integer(default=0, doc="Random seed for sampling (ignored when greedy).")
    keep_attention = param.String(default="none", doc="Layers whose full attention rows are kept besides the layer "
                                  "shown in the heatmap: 'all', 'none' or '0,3' (other layers keep their top-8 keys).")
    attention_float16 = param.Boolean(default=True, doc="Save the run's attention rows and residuals in float16 "
                                      "(half the bytes; attention error below 5e-4); off: float32.")
    keep_residuals = param.String(default="none", doc="Layers whose residuals are kept besides those the SAE and Drift cards need: 'all', 'none' or '0,3'.")
    sae_layer = param.Integer(default=None, allow_None=True, doc="Layer of the SAE the SAE card shows (its residuals are captured).")
    sae_width = param.Integer(default=None, allow_None=True, doc="Width the SAE reads: its layer is captured only on "
                              "models of that width (None: on any model).")
    drift_layers = param.List(default=[], item_type=int, doc="Layers the Drift card scores (their residuals are captured).")
    drift_width = param.Integer(default=None, allow_None=True, doc="Width of the model the drift profile was built on: "
                                "its layers are captured only on models of that width (None: on any model).")
    run_path = param.String(default="", doc="Path of a saved run directory to open.")

    # -- activity ----------------------------------------------------------------------------
    busy = param.Boolean(default=False, doc="A generation is running.")
    progress = param.Integer(default=0, doc="Steps finished by the running generation.")
    progress_max = param.Integer(default=1, doc="Steps planned by the running generation.")
    live_text = param.String(default="", doc="Text generated so far by the running generation.")
    status = param.String(default="", doc="One-line status shown under the controls.")
    error = param.String(default="", doc="Last error, one sentence (views show it as a notification).")

    def __init__(self, **params):
        super().__init__(**params)
        self._queries: pl.DataFrame | None = None
        # an error is about what was typed or done last: changing a setting or the run makes it stale
        self.param.watch(self._clear_error, ["model_source", "remote", "prompt", "max_new_tokens", "temperature",
                                             "seed", "keep_attention", "keep_residuals", "run_path", "revision"])
        if self.trajectory is not None:
            self.set_trajectory(self.trajectory)

    # -- derived facts -------------------------------------------------------------------------
    @property
    def n_steps(self) -> int:
        """Steps in the current run (0 when none)."""
        return 0 if self.trajectory is None else max(1, self.trajectory.n_steps)

    @property
    def prompt_len(self) -> int:
        return 0 if self.trajectory is None else self.trajectory.prompt_len

    @property
    def query_pos(self) -> int:
        """Position of the current step's query (the last prompt token at step 0)."""
        return positions.query_pos(self.step, self.prompt_len)

    @property
    def queries(self) -> pl.DataFrame:
        """One attention row per step × layer × head (see :func:`trajscope.metrics.attention.step_queries`)."""
        if self._queries is None:
            self._queries = step_queries(self.trajectory.attention) if self.trajectory is not None else pl.DataFrame()
        return self._queries

    def provenance(self) -> str:
        """One line naming the run on screen and its model (what every card's result belongs to).

        While a generation runs the line says the run on screen is about to be replaced and that
        actions on it wait (the views disable them).
        """
        traj = self.trajectory
        if traj is None:
            on_screen = "No run yet"
        else:
            model = traj.meta.get("model", {})
            # run ids and model ids come from files and the page: escaped text, never markup
            on_screen = (f"Run {md_text(traj.run_id)} on model {md_text(model.get('model_id', '?'))} "
                         f"({md_text(model.get('n_layers', '?'))} layers × {md_text(model.get('n_heads', '?'))} heads), "
                         f"{traj.n_steps} steps")
        if self.busy:
            return (f"{on_screen} — being replaced: a new run on {md_text(self.model_source)} is generating; actions "
                    "wait for it.")
        return on_screen + "."

    def step_for_pos(self, pos: int) -> int:
        """The step at which position ``pos`` is the query, clamped to the run's steps."""
        return min(positions.query_step(int(pos), self.prompt_len), self.n_steps - 1) if self.n_steps else 0

    # -- actions -------------------------------------------------------------------------------
    def set_trajectory(self, traj: Trajectory, step: int | None = None) -> None:
        """Show ``traj``: reset step bounds, layer and head choices; keep the step when still valid.

        The layer stays when the model does; a run of another model (or the first run) opens on a
        middle layer.
        """
        n_layers = int(traj.meta.get("model", {}).get("n_layers") or (traj.attention["layer"].max() or 0) + 1)
        n_heads = int(traj.meta.get("model", {}).get("n_heads") or (traj.attention["head"].max() or 0) + 1)
        last = max(0, max(1, traj.n_steps) - 1)
        heads = {"mean over heads": MEAN, **{f"head {h}": h for h in range(n_heads)}}
        with param.parameterized.batch_call_watchers(self):
            self._queries = None
            model_id = traj.meta.get("model", {}).get("model_id")
            new_model = self.trajectory is None or model_id != self.trajectory.meta.get("model", {}).get("model_id")
            self.param.layer.objects = list(range(n_layers))
            if new_model or self.layer not in self.param.layer.objects:
                self.layer = n_layers // 2  # a middle layer: the first and last of a deep model are atypical
            self.param.head.objects = heads
            if self.head not in heads.values():
                self.head = MEAN
            metrics = token_metric_choices(traj.tokens)
            self.param.token_metric.objects = metrics
            if self.token_metric not in metrics.values():
                self.token_metric = "entropy"
            self.param.step.bounds = (0, last)
            new_step = self.step if step is None else step
            self.step = min(max(0, new_step), last)
            self.token_extra = None
            self.trajectory = traj
            self.revision += 1

    def tokens(self) -> pl.DataFrame:
        """The run's tokens with the analyses' per-token columns (:attr:`token_extra`) joined on ``pos``."""
        toks = self.trajectory.tokens
        extra = self.token_extra
        if extra is None:
            return toks
        return toks.drop([c for c in extra.columns if c != "pos"], strict=False).join(extra, on="pos", how="left")

    def add_token_columns(self, extra: pl.DataFrame) -> None:
        """Offer ``extra`` (``pos`` + numeric columns) as token colourings of the run on screen."""
        old = self.token_extra
        if old is not None:
            extra = old.drop([c for c in extra.columns if c != "pos"], strict=False).join(extra, on="pos", how="full",
                                                                                         coalesce=True)
        with param.parameterized.batch_call_watchers(self):
            self.token_extra = extra
            self.param.token_metric.objects = token_metric_choices(self.tokens())

    def go(self, step: int) -> None:
        """Jump to ``step`` (clamped to the run)."""
        if self.trajectory is not None:
            self.step = min(max(0, int(step)), self.n_steps - 1)

    def next(self) -> None:
        """One step forward (stays on the last step)."""
        self.go(self.step + 1)

    def prev(self) -> None:
        """One step back."""
        self.go(self.step - 1)

    def _clear_error(self, *_) -> None:
        if self.error:
            self.error = ""

    def report(self, message: str) -> None:
        """Record an error sentence for the views to show (once: the status line is cleared)."""
        self.param.update(error=message, status="")

    def capture_plan(self) -> CapturePlan:
        """What Generate captures, frozen now: the typed settings plus the layers the cards on screen need.

        Residuals: the "keep residuals" layers, the SAE's layer and the Drift card's layers. Full
        attention rows: the "keep full attention rows" layers and the layer shown in the heatmap (a
        middle layer for a model not on screen yet: the layer its run opens on).

        Raises:
            TrajscopeError: empty prompt, a prompt or max new tokens over the server's caps, a temperature out of range,
                or an unreadable layers field.
        """
        if not self.prompt.strip():
            raise TrajscopeError("The prompt is empty; type some text to continue.")
        if self.max_new_tokens is None or int(self.max_new_tokens) < 1:
            raise TrajscopeError(f"Max new tokens must be at least 1 (it is {self.max_new_tokens}).")
        if self.temperature is None or not 0.0 <= float(self.temperature) <= MAX_TEMPERATURE:
            raise TrajscopeError(f"Temperature must be from 0 (greedy) to {MAX_TEMPERATURE:g} (it is {self.temperature}).")
        from trajscope.ui.operator import config

        config().new_tokens(int(self.max_new_tokens))
        config().prompt(self.prompt)  # whatever the page sent: checked before anything tokenises it
        wants = [(layer, self.drift_width) for layer in self.drift_layers or ()]
        wants += [] if self.sae_layer is None else [(self.sae_layer, self.sae_width)]
        want_res = tuple(sorted({layer for layer, width in wants if width is None}))
        want_if_width = tuple(sorted({(layer, width) for layer, width in wants if width is not None}))
        config = CaptureConfig(max_new_tokens=int(self.max_new_tokens), temperature=float(self.temperature),
                               seed=int(self.seed), residual_layers=parse_layers(self.keep_residuals, None, "residuals"),
                               attention_layers=parse_layers(self.keep_attention, None, "full attention rows"),
                               prefill_rows="all")  # the token strip colours prompt tokens too
        from trajscope.ui.artefacts import same_model

        on_screen = None if self.trajectory is None else self.trajectory.meta.get("model", {}).get("model_id")
        other_model = on_screen is None or not same_model(on_screen, self.model_source)  # it opens on a middle layer
        return CapturePlan(config, want_residuals=want_res, want_attention=(int(self.layer),),
                           float16=bool(self.attention_float16), want_if_width=want_if_width, shipped=True,
                           attention_middle=other_model)

    def size_estimate(self, shape, prompt_len: int) -> str:
        """One sentence: about how many bytes the next Generate writes to the runs directory, and why.

        Args:
            shape: a :class:`~trajscope.ui.storage.RunShape` (or a loaded model: same attributes).
            prompt_len: the prompt's tokens.
        Raises:
            TrajscopeError: the settings are not valid (as :meth:`capture_plan`).
        """
        from trajscope.ui.storage import RunShape, estimate_bytes, human

        plan = self.capture_plan()
        n_att, n_res = plan.kept_layers(shape.n_layers, shape.d_model, getattr(shape, "model_id", None))
        n = estimate_bytes(RunShape(shape.n_layers, shape.n_heads, shape.d_model), prompt_len,
                           plan.config.max_new_tokens, n_att, n_res, plan.float16)
        kept = (f"full attention rows of {n_att} layer{'s' if n_att != 1 else ''}, residuals of {n_res} "
                f"layer{'s' if n_res != 1 else ''}" + (", in float16" if plan.float16 else ", in float32"))
        return f"Saved run: up to {human(n)} ({kept})."

    def model_key(self) -> tuple[str, bool]:
        """What identifies the model to load: ``(source, remote)`` (never the key)."""
        from trajscope.ui.operator import config

        src = self.model_source.strip()
        if not src:
            raise TrajscopeError("A model source is needed: 'sample', a model directory, a cached Hugging Face name, or an NDIF model.")
        return config().model(src, tuple(self.trusted_models)), bool(self.remote)

    def __repr__(self) -> str:  # the API key must not appear in reprs that end up in logs
        return f"AppState(run={getattr(self.trajectory, 'run_id', None)!r}, step={self.step})"
