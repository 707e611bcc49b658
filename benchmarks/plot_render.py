"""Browser render time of the app's two largest heatmaps: one glyph per cell against one image.

The Eviction card's kept-keys map (270 layer × head rows × 41 prompt positions on SmolLM2's chat prompt) and
the Drift card's heatmap (30 layers × 104 positions) were drawn with a glyph per cell (HoloViews
``Rectangles`` / ``HeatMap``); they are now one ``Image`` each. This script builds both forms of each from the
same random data (the card's own figure for the drift image; the per-cell form as the card drew it before),
saves each as a standalone page, and in headless Chromium renders each page's document again ``--reps`` times
into a fresh element, timing JSON → views → two animation frames (the figure's own setup included). Pages
alternate, so each pair is read under the same load.

Run: ``python benchmarks/plot_render.py [--reps 7] [--rounds 2]``; prints per-form render times (ms) and their
medians. Results on this machine are in docs/performance.md.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile

import holoviews as hv
import numpy as np
import polars as pl
from bokeh.io import save as bokeh_save
from bokeh.resources import INLINE

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

RENDER = """async (reps) => {
  const json = Bokeh.documents[0].to_json(); const out = [];
  for (let i = 0; i < reps; i++) {
    const el = document.createElement('div'); el.style.width = '1200px'; document.body.appendChild(el);
    const t0 = performance.now();
    const doc = Bokeh.documents[0].constructor.from_json(json);
    const views = await Bokeh.embed.add_document_standalone(doc, el);
    await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
    out.push(performance.now() - t0);
    for (const v of views) v.remove(); el.remove();
  }
  return out; }"""


def pages(folder: pathlib.Path) -> dict[str, pathlib.Path]:
    """The four standalone pages (per-cell and image form of each heatmap)."""
    from trajscope.studies.drift import plots as dp
    from trajscope.studies.drift.figures import HeatmapFigure
    from trajscope.studies.eviction.plots import EVICTED, KEPT

    hv.extension("bokeh")
    rng = np.random.default_rng(0)
    P, N, L, rows = 41, 64, 30, 270
    pos, layer = np.meshgrid(np.arange(P + N), np.arange(L))
    drift = pl.DataFrame({"pos": pos.ravel(), "layer": layer.ravel(),
                          "score": (1 + 0.3 * rng.standard_normal(pos.shape)).ravel()})
    texts = [f"t{i}" for i in range(P + N + 1)]
    out = {}
    df = drift.filter(pl.col("pos") > 0).with_columns((pl.col("pos") - P + 1).alias("xstep"),
                                                       pl.lit(0).alias("step"))
    cells = hv.HeatMap(df.select("xstep", "layer", "score", "pos", "step").to_pandas(), kdims=["xstep", "layer"],
                       vdims=["score", "pos", "step"]).opts(cmap="RdBu_r", colorbar=True, tools=["hover"],
                                                           invert_yaxis=True)
    heat = HeatmapFigure()  # the card's own figure, as the app draws it
    heat.show(dp.heatmap_data(drift, P, texts))
    heat.figure.update(sizing_mode="fixed", width=1100, height=600)
    forms = {"drift, a rectangle per cell (HeatMap)": cells, "drift, one image (the card's HeatmapFigure)": heat.figure}
    kept = rng.random((rows, P)) < 0.5
    x0 = np.tile(np.arange(P), rows) - 0.5
    y0 = np.repeat(np.arange(rows), P) - 0.5
    key = np.where(kept.ravel(), "kept", "evicted")
    n = rows * P
    rect = hv.Rectangles({"x0": x0, "y0": y0, "x1": x0 + 1, "y1": y0 + 1, "pos": x0 + 0.5, "head": ["L0 H0"] * n,
                          "key": key, "token": ["tok"] * n, "phase": ["prefill"] * n},
                         ["x0", "y0", "x1", "y1"], ["pos", "head", "key", "token", "phase"]).opts(
        color=hv.dim("key").categorize({"kept": KEPT, "evicted": EVICTED}), line_color="white", line_width=0.5,
        tools=["hover"], invert_yaxis=True)
    img = hv.Image(kept[::-1].astype(np.float32), bounds=(-0.5, -0.5, P - 0.5, rows - 0.5)).opts(
        cmap=[EVICTED, KEPT], clim=(0, 1), tools=["hover"], invert_yaxis=True)
    forms.update({"kept keys, a rectangle per cell (Rectangles)": rect, "kept keys, one image": img})
    for i, (name, el) in enumerate(forms.items()):
        path = folder / f"form{i}.html"
        if isinstance(el, hv.core.Dimensioned):
            hv.save(el.opts(responsive=False, width=1100, height=600, clone=True), path, resources=INLINE)
        else:
            bokeh_save(el, path, resources=INLINE, title=name)
        out[name] = path
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    folder = pathlib.Path(tempfile.mkdtemp(prefix="trajscope-plot-render-"))
    forms = pages(folder)
    times: dict[str, list[float]] = {name: [] for name in forms}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                    args=["--headless", "--no-sandbox", "--disable-gpu"])
        for _ in range(args.rounds):
            for name, path in forms.items():
                page = browser.new_page(viewport={"width": 1300, "height": 900})
                page.goto(path.as_uri())
                page.wait_for_function("() => window.Bokeh && Bokeh.documents.length > 0")
                times[name] += page.evaluate(RENDER, args.reps)
                page.close()
        browser.close()
    for name, ts in times.items():
        print(f"{name}: median {statistics.median(ts):.0f} ms (n = {len(ts)}; {min(ts):.0f}–{max(ts):.0f})")


if __name__ == "__main__":
    main()
