"""Comparison report: two or more runs side by side in one standalone HTML file.

``ts.compare(runs).save("report.html")`` writes ``report.html`` with the Bokeh
JavaScript and CSS inline (it opens offline, with a double click) and, beside
it, ``report_files/`` holding every table the report plots as Parquet. The
sections present depend on what the runs contain:

- **Overview**: model, settings, prompt and stop reason per run; generated tokens
  aligned by step with the cells that differ from the first run marked;
- **Attention telemetry**: per-step means over layers and heads of normalised
  entropy, prefix (prompt) mass and sink mass;
- **Residual statistics**: per-step residual norm and excess kurtosis (mean over
  layers) relative to the same run's prefill positions, and drift-probe flags
  when a probe was attached;
- **Drift** (given a prefill profile and runs that kept residuals): mean drift
  score and flagged fraction by layer × decode-depth band;
- **Steering**: each steered run's settings, and its next-token entropy and
  logprob by step with the onset marked;
- **SAE features**: active features (L0) per step, when an SAE was attached;
- **KV-cache eviction**: when run directories hold an eviction study
  (:mod:`trajscope.studies.eviction.runs`, written by ``trajscope eviction --runs``).
"""

from __future__ import annotations

import os
import pathlib
from typing import Sequence

import polars as pl

from trajscope import positions
from trajscope.errors import TrajscopeError
from trajscope.escaping import html_text
from trajscope.metrics.attention import TELEMETRY_FIELDS, step_telemetry
from trajscope.metrics.next_token import step_outputs
from trajscope.metrics.position_zscore import position_zscore
from trajscope.studies.eviction.runs import NOTE as EVICTION_NOTE, eviction_figures, eviction_html, eviction_tables
from trajscope.reports.page import components, render
from trajscope.trajectory import Trajectory, parquet_metadata

MAX_ALIGNED_STEPS = 300
MAX_CURVES = 12  # beyond this many runs, plots show the mean and the 10–90% range across runs
MAX_ALIGNED_RUNS = 12


def _label(traj: Trajectory, i: int) -> str:
    return f"{i + 1}: {traj.run_id}"


def overview_table(runs: Sequence[Trajectory]) -> pl.DataFrame:
    """One row per run: identity, model, sampling, steering, stop reason, lengths."""
    rows = []
    for t in runs:
        m, s = t.meta, t.meta.get("sampling", {})
        steer = "; ".join(f"{v['name']}@L{v['layer']} ×{v['strength']} from step {v['start_step']}"
                          for v in m.get("steering") or []) or "none"
        rows.append({"run_id": t.run_id, "model": m["model"]["model_id"], "family": m["model"]["family"],
                     "dtype": m["model"]["dtype"], "device": m["model"]["device"],
                     "sampling": "greedy" if not s.get("do_sample") else f"T={s.get('temperature')}",
                     "seed": s.get("seed"), "steering": steer, "stop_reason": m.get("stop_reason"),
                     "prompt_len": t.prompt_len, "generated": m.get("n_generated"),
                     "prompt": (m.get("prompt") or "")[:200]})
    return pl.DataFrame(rows)


def aligned_tokens(runs: Sequence[Trajectory]) -> pl.DataFrame:
    """Generated tokens aligned by the step that produced them: ``produced_at_step`` then one text column per run.

    The token at ``pos = P + s`` is produced by step s (0 = the prefill pass); see :mod:`trajscope.positions`.
    """
    frames = []
    for i, t in enumerate(runs):
        frames.append(t.tokens.filter(pl.col("phase") == "decode").select(
            positions.produced_at_step_expr(t.prompt_len), pl.col("text").alias(_label(t, i))))
    out = frames[0]
    for f in frames[1:]:
        out = out.join(f, on="produced_at_step", how="full", coalesce=True)
    return out.sort("produced_at_step")


def telemetry_by_step(runs: Sequence[Trajectory]) -> pl.DataFrame:
    """Per run and step: :func:`trajscope.metrics.attention.step_telemetry` (mean over layers and heads at
    the step's query) — the numbers the app's telemetry card shows.

    Works on eager tables and on lazy scans (``Trajectory.load(path, lazy=True)``) alike; each run
    is reduced before the next is read.
    """
    parts = []
    for t in runs:
        att = t.attention.lazy().select("step", "pos", "layer", "head", "top_pos", *TELEMETRY_FIELDS)
        tele = step_telemetry(att)
        tele = tele.collect(engine="streaming") if isinstance(tele, pl.LazyFrame) else tele
        parts.append(tele.with_columns(pl.lit(t.run_id).alias("run_id")))
    return pl.concat(parts, how="diagonal_relaxed").sort("run_id", "step")


def residual_by_step(runs: Sequence[Trajectory]) -> pl.DataFrame:
    """Per run and decode step: :func:`trajscope.metrics.position_zscore.position_zscore` of the residual norm
    and excess kurtosis at the step's query position, mean over layers — the token strip's "drift" colouring."""
    parts = []
    for t in runs:
        act = t.activations.lazy().select("pos", "phase", "layer", "norm", "kurtosis").collect(engine="streaming")
        z = position_zscore(act, None, "norm").rename({"drift": "norm_z"}).join(
            position_zscore(act, None, "kurtosis").rename({"drift": "kurtosis_z"}), on="pos")
        parts.append(z.filter(pl.col("pos") >= t.prompt_len).with_columns(
            positions.query_step_expr(t.prompt_len), pl.lit(t.run_id).alias("run_id")).drop("pos"))
    return pl.concat(parts).sort("run_id", "step")


def steering_by_step(runs: Sequence[Trajectory]) -> pl.DataFrame:
    """Per run and step: :func:`trajscope.metrics.next_token.step_outputs` (entropy and logprob at x = the
    step that computed them) — the same rows as the app's next-token plot."""
    return pl.concat([step_outputs(t.tokens, t.prompt_len).with_columns(pl.lit(t.run_id).alias("run_id"))
                      for t in runs]).select("run_id", "step", "entropy", "logprob", "text")


def _curves(df: pl.DataFrame, y: str, title: str, ylabel: str, order: Sequence[str],
            marks: dict[str, int] | None = None, x: str = "step", xlabel: str = "step (0 = prefill)"):
    """A Bokeh figure: ``y`` by step, one line per run (or mean and 10–90% band beyond MAX_CURVES runs).

    The report builds plain Bokeh figures in a document of its own, so writing a report never
    touches the documents of a Panel server running in the same process.
    """
    from bokeh.models import HoverTool, Span
    from bokeh.plotting import figure

    from bokeh.palettes import Category10_10 as LAYER_COLORS

    fig = figure(width=900, height=260, title=title, x_axis_label=xlabel, y_axis_label=ylabel,
                 tools="pan,wheel_zoom,box_zoom,reset,save")
    fig.add_tools(HoverTool(tooltips=[(x, "@x{0}"), (y, "@y")]))
    if len(order) > MAX_CURVES:
        agg = df.group_by(x).agg(pl.col(y).mean().alias("m"), pl.col(y).quantile(0.1).alias("lo"),
                                 pl.col(y).quantile(0.9).alias("hi")).sort(x)
        xs = agg[x].to_numpy()
        fig.varea(x=xs, y1=agg["lo"].to_numpy(), y2=agg["hi"].to_numpy(), fill_color="#1f77b4", fill_alpha=0.2,
                  legend_label="10–90% of runs")
        fig.line(x=xs, y=agg["m"].to_numpy(), color="#1f77b4", legend_label=f"mean of {len(order)} runs")
        order = []
    for i, rid in enumerate(order):
        sub = df.filter(pl.col("run_id") == rid).sort(x)
        if sub.is_empty():
            continue
        color = LAYER_COLORS[i % len(LAYER_COLORS)]
        fig.line(x=sub[x].to_numpy(), y=sub[y].to_numpy(), color=color, line_width=1.5, legend_label=rid)
        if marks and rid in marks:
            fig.add_layout(Span(location=marks[rid], dimension="height", line_color=color, line_dash="dotted"))
    fig.add_layout(fig.legend[0], "right")
    return fig


class Comparison:
    """Two or more runs, ready to be written as a report.

    Attributes:
        runs: the trajectories, in order (the first is the reference for token differences).
        skipped: ``(path, reason)`` of runs left out with ``skip_bad=True``.
    """

    def __init__(self, runs: Sequence[Trajectory], skipped: Sequence[tuple[str, str]] = (), profile=None,
                 paths: Sequence[str | None] | None = None):
        if not runs:
            raise TrajscopeError("A report needs at least one readable run.")
        self.runs = list(runs)
        self.skipped = list(skipped)
        self.profile = profile
        self.paths = list(paths) if paths is not None else [None] * len(self.runs)  # run directory of lazy runs

    def tables(self) -> dict[str, pl.DataFrame]:
        """Every table the report shows, by file name."""
        out = {"overview": overview_table(self.runs), "tokens_aligned": aligned_tokens(self.runs[:MAX_ALIGNED_RUNS]),
               "attention_by_step": telemetry_by_step(self.runs), "residual_by_step": residual_by_step(self.runs)}
        probes = [t.probe for t in self.runs if t.probe is not None]
        if probes:
            out["probe"] = pl.concat(probes)
        feats = [t.features.with_columns(pl.lit(t.run_id).alias("run_id")) if "run_id" not in t.features.columns
                 else t.features for t in self.runs if t.features is not None]
        if feats:
            out["features"] = pl.concat(feats, how="diagonal_relaxed")
        if self.profile is not None:
            from trajscope.metrics.profile_drift import profile_drift_by_group

            scored = [Trajectory.load(path) if path else t for t, path in zip(self.runs, self.paths)
                      if any(k.startswith("residual.") for k in (t.meta.get("tensors") or t.tensors))]
            if scored:
                out["drift_by_depth"] = profile_drift_by_group(scored, self.profile, by="depth_band")
        if any(t.meta.get("steering") for t in self.runs):
            out["steering_by_step"] = steering_by_step(self.runs)
        out.update(eviction_tables(self.runs, self.paths))
        return out

    def _aligned_html(self, aligned: pl.DataFrame) -> str:
        cols = aligned.columns[1:]
        rows = []
        for r in aligned.head(MAX_ALIGNED_STEPS).iter_rows():
            ref = r[1]
            cells = "".join(
                f"<td class='{'diff' if j > 0 and v != ref else ''}'><code>{html_text(repr(v)[1:-1] if v else '')}</code></td>"
                for j, v in enumerate(r[1:]))
            rows.append(f"<tr><td>{r[0]}</td>{cells}</tr>")
        head = "".join(f"<th>{html_text(c)}</th>" for c in cols)
        more = (f"<p>First {MAX_ALIGNED_STEPS} of {aligned.height} steps shown; all are in "
                "tokens_aligned.parquet.</p>") if aligned.height > MAX_ALIGNED_STEPS else ""
        return (f"<div class='scroll'><table><tr><th>produced at step</th>{head}</tr>{''.join(rows)}</table></div>{more}")

    def figures(self, tables: dict[str, pl.DataFrame] | None = None) -> list[tuple[str, object]]:
        """The report's Bokeh figures as ``(section, figure)`` pairs (built from :meth:`tables`)."""
        tables = self.tables() if tables is None else tables
        att, res = tables["attention_by_step"], tables["residual_by_step"]
        order = [t.run_id for t in self.runs]
        plots = [  # runs without attention rows (served by vLLM: docs/serving-vllm.md) have no attention curves
            ("attention", _curves(att, "entropy_norm", "Attention entropy / log(#keys), mean over layers and heads", "entropy (norm.)", order)),
            ("attention", _curves(att, "prefix_mass", "Prefix (prompt) mass — share of attention on the prompt", "prefix mass", order)),
            ("attention", _curves(att, "sink_mass", "Sink mass — attention on position 0", "sink mass", order)),
        ] if att.drop_nulls("entropy_norm").height else []
        plots += [
            ("residual", _curves(res, "norm_z", "Residual norm, z-score against the run's prefill positions (mean over layers)", "z", order)),
            ("residual", _curves(res, "kurtosis_z", "Excess kurtosis, z-score against the run's prefill positions (mean over layers)", "z", order)),
        ]
        if "steering_by_step" in tables:
            marks = {t.run_id: min(v["start_step"] for v in t.meta["steering"]) for t in self.runs if t.meta.get("steering")}
            st = tables["steering_by_step"]
            plots.append(("steering", _curves(st, "entropy", "Next-token entropy by step (dotted: steering onset)", "nats", order, marks)))
            plots.append(("steering", _curves(st.drop_nulls("logprob"), "logprob", "Logprob of the token each step produced", "logprob", order, marks)))
        if "drift_by_depth" in tables:
            plots.extend(("drift", p) for p in _drift_plots(tables["drift_by_depth"], self.profile))
        if "features" in tables and {"pos", "feature"} <= set(tables["features"].columns):
            f = tables["features"]
            l0 = f.group_by("run_id", "pos").len().rename({"len": "active"})
            plots.append(("sae", _curves(l0, "active", "Active SAE features kept per position", "count", order,
                                         x="pos", xlabel="position")))
        plots.extend(("eviction", p) for p in eviction_figures(tables))
        return plots

    def save(self, path: str | os.PathLike) -> pathlib.Path:
        """Write the standalone HTML report and ``<stem>_files/*.parquet``. Returns the HTML path."""
        path = pathlib.Path(path)
        files = path.with_name(path.stem + "_files")
        tables = self.tables()
        try:
            files.mkdir(parents=True, exist_ok=True)
            for name, df in tables.items():
                df.write_parquet(files / f"{name}.parquet", metadata=parquet_metadata(name))
        except OSError as exc:
            raise TrajscopeError(f"Cannot write the report to '{path}': {exc.strerror or exc}.") from exc
        plots = self.figures(tables)
        # Render into a fresh document: a served Panel session elsewhere in the process may have left
        # its own document current, and plots must not attach to it.
        script, divs = components([p for _, p in plots])
        by_section: dict[str, list[str]] = {}
        for (section, _), div in zip(plots, divs):
            by_section.setdefault(section, []).append(div)
        titles = {"attention": "Attention telemetry", "residual": "Residual statistics versus prefill",
                  "steering": "Steering", "sae": "SAE features", "drift": "Drift versus the prefill profile",
                  "eviction": "KV-cache eviction"}
        notes = {"attention": "Per step, at the step's query (the last prompt position for step 0).",
                 "residual": "Decode steps only, at each step's query; 0 means 'as during this run's prefill'.",
                 "steering": "", "sae": "", "eviction": EVICTION_NOTE,
                 "drift": ("Diagonal Mahalanobis distance to the prefill profile ÷ √d (≈ 1 in distribution), and the "
                           "share of positions above each layer's threshold (calibrated on held-out prefill to the "
                           "profile's false-positive rate), by layer and decode-depth band, over all runs.")}
        body = [f"<h2>Overview</h2>{_df_html(tables['overview'])}",
                "<h3>Generated tokens by step (highlighted: differs from run 1)"
                + (f" — the first {MAX_ALIGNED_RUNS} of {len(self.runs)} runs" if len(self.runs) > MAX_ALIGNED_RUNS else "")
                + "</h3>",
                self._aligned_html(tables["tokens_aligned"])]
        extra = {"eviction": eviction_html(tables)}
        for key in ("attention", "residual", "drift", "steering", "sae", "eviction"):
            if key in by_section:
                body.append(f"<h2>{titles[key]}</h2><p class='note'>{notes[key]}</p>" + extra.get(key, "")
                            + "".join(by_section[key]))
        if self.skipped:
            body.append("<h2>Runs left out</h2><ul>" + "".join(
                f"<li><code>{html_text(p)}</code>: {html_text(r)}</li>" for p, r in self.skipped) + "</ul>")
        body.append(f"<p class='note'>Tables: <code>{html_text(files.name)}/</code> ({', '.join(sorted(tables))}"
                    ".parquet).</p>")
        doc = render(f"trajscope report — {len(self.runs)} run{'s' if len(self.runs) != 1 else ''}", "\n".join(body),
                     script)
        try:
            path.write_text(doc, encoding="utf-8")
        except OSError as exc:
            raise TrajscopeError(f"Cannot write the report to '{path}': {exc.strerror or exc}.") from exc
        return path


def _drift_plots(by_depth: pl.DataFrame, profile) -> list:
    """Bokeh heatmaps layer × depth band of the mean drift score and of the flagged fraction."""
    from bokeh.models import ColorBar, ColumnDataSource, HoverTool, LinearColorMapper
    from bokeh.palettes import Reds256, Viridis256
    from bokeh.plotting import figure

    from trajscope.metrics.bands import DEPTH_ORDER

    bands = [b for b in DEPTH_ORDER if b in set(by_depth["depth_band"])]
    layers = [str(x) for x in sorted(by_depth["layer"].unique().to_list())]
    out = []
    for col, title, palette in (("score", "Mean drift score", Viridis256),
                                ("flagged_frac", f"Flagged fraction (target on prefill: {profile.info.get('fpr')})",
                                 list(reversed(Reds256)))):
        sub = by_depth.filter(pl.col("depth_band").is_in(bands))
        src = ColumnDataSource({"band": sub["depth_band"].to_list(), "layer": [str(x) for x in sub["layer"]],
                                "value": sub[col].to_list()})
        mapper = LinearColorMapper(palette=palette, low=float(sub[col].min()), high=float(sub[col].max()))
        fig = figure(width=440, height=260, title=title, x_range=bands, y_range=list(reversed(layers)),
                     x_axis_label="depth band", y_axis_label="layer", tools="save")
        fig.rect(x="band", y="layer", width=1, height=1, source=src, fill_color={"field": "value", "transform": mapper},
                 line_color=None)
        fig.add_tools(HoverTool(tooltips=[("band", "@band"), ("layer", "@layer"), (col, "@value{0.000}")]))
        fig.add_layout(ColorBar(color_mapper=mapper), "right")
        out.append(fig)
    return out


def _df_html(df: pl.DataFrame) -> str:
    head = "".join(f"<th>{html_text(c)}</th>" for c in df.columns)
    rows = "".join("<tr>" + "".join(f"<td>{html_text(str(v))}</td>" for v in r) + "</tr>" for r in df.iter_rows())
    return f"<div class='scroll'><table><tr>{head}</tr>{rows}</table></div>"


def compare(runs: Sequence[Trajectory | str | os.PathLike], skip_bad: bool = False, profile=None) -> Comparison:
    """Collect runs (trajectories or run directories) into a :class:`Comparison`.

    Args:
        runs: what to compare, the first being the reference.
        skip_bad: leave unreadable run directories out (named in the report) instead of failing.
        profile: a :class:`~trajscope.profile.ReferenceProfile` (or its path); adds the drift section
            (layer × depth band) for runs that kept residuals.
    Raises:
        TrajscopeError: naming the first unreadable run (unless ``skip_bad``).
    """
    from trajscope.leftovers import is_temporary

    loaded, skipped, paths = [], [], []
    for r in runs:
        if not isinstance(r, Trajectory) and is_temporary(r):  # a save's temporary directory is never a run
            continue
        if isinstance(r, Trajectory):
            loaded.append(r)
            paths.append(None)
            continue
        try:
            loaded.append(Trajectory.load(r, lazy=True))  # big tables stay on disk until each is reduced
            paths.append(str(r))
        except TrajscopeError as exc:
            if not skip_bad:
                raise TrajscopeError(f"Cannot report on '{r}': {str(exc).rstrip('.')} (use --skip-bad to leave it "
                                     "out).") from exc
            skipped.append((str(r), str(exc)))
    if isinstance(profile, (str, os.PathLike)):
        from trajscope.profile import ReferenceProfile

        profile = ReferenceProfile.load(profile)
    return Comparison(loaded, skipped, profile=profile, paths=paths)
