"""Benchmark: the served app under many browser sessions, two of them generating, and its recovery.

Serves the app in-process on loopback (``--model``, default the tiny sample model) and drives
headless Chromium pages (one browser, one page each: separate sessions):

1. **Idle.** One page alone: ``--idle-presses`` presses of → / ←, each timed in the browser from
   the ``keydown`` to the frame where the step readout changed (*readout*) and to the frame where
   every step cursor of the Overview tab sits at the new step (*all plots*: token strip and
   telemetry curves, the values the server computed for that step).
2. **Load.** ``--sessions`` pages in all. Two of them type their own prompts and generate
   ``--tokens`` tokens at once, pressing Generate again as each run ends (``--generations`` runs
   each); meanwhile every other page presses → / ← in turn, round after round, until both have
   finished their runs and at least ``--rounds`` rounds are done. Each press is timed as above;
   presses made while a generation ran are counted apart. **Crossed state**: each generating page
   must show its own prompt, and no page the other's.
3. **Recovery.** Every page but the first is closed; once the server has released their sessions
   (``--release-timeout``), the first page is timed again as in 1, and the server's RSS and thread
   count are compared with their idle values. Whether the closed sessions' memory is free is told
   apart from whether glibc returned it to the system: the script drops its own references to
   their apps, counts those still alive after ``gc.collect()``, and samples RSS again after
   ``malloc_trim(0)``.

A sampler records every 0.5 s the server process's CPU time (this process: the Panel server, the
model and the Playwright driver's thread) and, apart, the CPU time of its child processes (the
Playwright driver and Chromium: the browsers' share), its RSS and its thread count. The server's
own share is the first; on a machine where the browsers run elsewhere, only that share would load
the server.

Run: ``python benchmarks/app_load.py [--sessions 10] [--model sample] [--tokens 64]
[--out benchmarks/results/app_load_sample_10.json]``. Bounded: at most ``--sessions`` pages,
loopback only.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import pathlib
import platform
import sys
import tempfile
import threading
import time
import weakref

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from app_generate import ARGS, load_model, serve_pages  # noqa: E402  (the Chromium flags, the served app: one copy)

READOUT = """() => { let out = ''; const walk = r => r.querySelectorAll('*').forEach(e => {
    if (e.classList && e.classList.contains('ts-step-readout')) out = (e.shadowRoot || e).textContent;
    if (e.shadowRoot) walk(e.shadowRoot); }); walk(document); return out; }"""
# resolves [ms to the readout's change, ms to every cursor model at its expected value] after the last keydown
MEASURE = """async ([before, expected]) => {
  const read = %s;
  const models = Bokeh.documents.flatMap(d => Object.keys(expected).map(id => [id, d.get_model_by_id(id)]))
      .filter(([id, m]) => m);
  const ok = () => models.every(([id, m]) => Object.entries(expected[id]).every(([k, v]) => Math.abs(m[k] - v) < 1e-6));
  const t0 = window.__key;
  let t_read = null, t_all = null;
  while (t_read === null || t_all === null) {
    await new Promise(r => requestAnimationFrame(r));
    const now = performance.now();
    if (t_read === null && read() !== before) t_read = now - t0;
    if (t_all === null && ok()) t_all = now - t0;
    if (now - t0 > 10000) break;
  }
  return [t_read === null ? -1 : t_read, t_all === null ? -1 : t_all];
}""" % READOUT
KEYTIME = "() => document.addEventListener('keydown', () => { window.__key = performance.now(); }, true)"
STRIP = """() => Bokeh.documents.flatMap(d => [...d.all_models]).filter(m => m.data && m.data.token)
    .map(m => m.data.token.join(''))"""
PROMPTS = ["class Queue:\n    def put(self, x):\n", "import math\n\ndef area(r):\n"]


class Sampler:
    """Every ``every`` seconds: server CPU s, browsers' CPU s (child processes), RSS MiB, threads."""

    def __init__(self, every: float = 0.5):
        import psutil

        self.proc, self.every, self.rows, self._stop = psutil.Process(), every, [], threading.Event()
        self._children: dict[int, float] = {}  # pid → last CPU seconds seen (exited children keep theirs)
        self.thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def sample(self, label: str = "") -> dict:
        t = self.proc.cpu_times()
        for c in self.proc.children(recursive=True):
            try:
                ct = c.cpu_times()
                self._children[c.pid] = ct.user + ct.system
            except Exception:  # the child exited between the listing and the read
                pass
        row = {"t": time.perf_counter(), "server_cpu_s": t.user + t.system, "browsers_cpu_s": sum(self._children.values()),
               "rss_mib": self.proc.memory_info().rss / 2**20, "threads": self.proc.num_threads(), "label": label}
        self.rows.append(row)
        return row

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def start(self) -> "Sampler":
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.thread.join()


def wait(cond, timeout=300.0):
    t0 = time.time()
    while not cond():
        if time.time() - t0 > timeout:
            raise TimeoutError("timed out")
        time.sleep(0.05)


def pct(xs: list[float], q: float) -> float | None:
    xs = sorted(x for x in xs if x >= 0)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else None


def summary(times: list[tuple[float, float]]) -> dict:
    read, all_ = [r for r, _ in times], [a for _, a in times]
    return {"n": len(times), "timeouts": sum(r < 0 for r in read),
            "readout_ms": {"p50": pct(read, 0.5), "p95": pct(read, 0.95), "max": pct(read, 1.0)},
            "all_plots_ms": {"p50": pct(all_, 0.5), "p95": pct(all_, 0.95), "max": pct(all_, 1.0),
                             "timeouts": sum(a < 0 for a in all_)}}


def press(page, app) -> tuple[float, float]:
    """One → or ← on ``page`` (whichever moves the step), timed to the readout and to every Overview cursor."""
    from app_generate import cursors, expected

    step, n = app.state.step, app.state.n_steps
    key, target = ("ArrowLeft", step - 1) if step > 0 else ("ArrowRight", min(step + 1, n - 1))
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    before = page.evaluate(READOUT)
    want = expected(cursors(app, "Overview"), target)
    page.keyboard.press(key)
    return tuple(page.evaluate(MEASURE, [before, want]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--model", default="sample")
    ap.add_argument("--rounds", type=int, default=10, help="key-press rounds over all pages, at least")
    ap.add_argument("--idle-presses", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=64, help="tokens each of the two generating sessions asks for")
    ap.add_argument("--generations", type=int, default=3, help="Generates per generating session during the load")
    ap.add_argument("--max-load-s", type=float, default=600.0, help="the load phase stops after this many seconds")
    ap.add_argument("--release-timeout", type=float, default=90.0, help="seconds to wait for closed sessions' release")
    ap.add_argument("--port", type=int, default=5095)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out_path = pathlib.Path(args.out or ROOT / "benchmarks" / "results" / f"app_load_{args.model}_{args.sessions}.json")
    os.environ.setdefault("TRAJSCOPE_RUNS_DIR", tempfile.mkdtemp(prefix="trajscope-load-runs-"))
    os.environ["TRAJSCOPE_MAX_GENERATIONS"] = "2"
    os.environ["TRAJSCOPE_MAX_SESSIONS"] = str(max(20, args.sessions))
    import torch
    from playwright.sync_api import sync_playwright

    from trajscope.ui import operator

    operator.configure(None)
    load_model(args.model)
    sampler = Sampler()
    server, apps = serve_pages(args.model, args.port)
    out = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
           "date": time.strftime("%Y-%m-%d %H:%M"), "model": args.model, "sessions": args.sessions,
           "generating": 2, "tokens": args.tokens, "browsers": "same machine (their CPU is sampled apart)"}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            sampler.start()

            def open_page(k: int):
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"http://localhost:{args.port}/", timeout=300_000)
                wait(lambda: len(apps) == k + 1 and apps[k].state.trajectory is not None and not apps[k].state.busy,
                     timeout=600)
                page.locator(".ts-generate").wait_for(timeout=300_000)
                page.evaluate(KEYTIME)
                time.sleep(0.5)
                return page

            # 1. idle: one session
            pages = [open_page(0)]
            time.sleep(2)
            idle0 = sampler.sample("idle")
            out["idle"] = summary([press(pages[0], apps[0]) for _ in range(args.idle_presses)])
            idle1 = sampler.sample("idle end")
            out["idle"]["server_cpu_s_per_press"] = (idle1["server_cpu_s"] - idle0["server_cpu_s"]) / args.idle_presses
            # 2. load (a function: its locals, which hold the sessions' apps, die when it returns)
            def load_phase() -> None:
                t_open = time.perf_counter()
                for k in range(1, args.sessions):
                    pages.append(open_page(k))
                out["all_pages_shown_s"] = time.perf_counter() - t_open
                for page, prompt in zip(pages[:2], PROMPTS):
                    area = page.locator(".ts-prompt textarea")
                    area.fill(prompt)
                    area.press("Tab")
                    box = page.get_by_label("Max new tokens", exact=True)
                    box.fill(str(args.tokens))
                    box.press("Enter")
                wait(lambda: [a.state.prompt for a in apps[:2]] == PROMPTS and all(
                    a.state.max_new_tokens == args.tokens for a in apps[:2]))
                load0 = sampler.sample("load start")
                gen_pages, gen_apps = pages[:2], apps[:2]
                steppers = list(zip(pages[2:], apps[2:])) or list(zip(pages, apps))
                runs_done = [0, 0]
                last_run = [a.state.trajectory.run_id for a in gen_apps]

                pending = [False, False]  # a Generate click not yet answered by a finished run

                def keep_generating() -> None:
                    """Each generating session presses Generate again once its last run is done (``--generations`` each)."""
                    for i, (page, app) in enumerate(zip(gen_pages, gen_apps)):
                        if app.state.busy:
                            continue
                        if app.state.trajectory.run_id != last_run[i]:  # a run finished
                            runs_done[i], last_run[i], pending[i] = runs_done[i] + 1, app.state.trajectory.run_id, False
                        if not pending[i] and runs_done[i] < args.generations:
                            page.locator(".ts-generate button").click()
                            pending[i] = True

                t_gen = time.perf_counter()
                during, after, r = [], [], 0
                while r < args.rounds or min(runs_done) < args.generations:
                    for page, app in steppers:
                        keep_generating()
                        busy = any(a.state.busy for a in gen_apps)
                        (during if busy else after).append(press(page, app))
                    r += 1
                    if time.perf_counter() - t_gen > args.max_load_s:
                        break
                wait(lambda: not any(a.state.busy for a in gen_apps), timeout=600)
                load1 = sampler.sample("load end")
                out["generation"] = {"runs_per_session": runs_done, "load_s": time.perf_counter() - t_gen}
                out["load"] = {"all": summary(during + after), "while_generating": summary(during),
                               "not_generating": summary(after), "rounds": r, "stepping_sessions": len(steppers)}
                wall = load1["t"] - load0["t"]
                out["load"]["cpu"] = {"wall_s": wall, "server_cpu_s": load1["server_cpu_s"] - load0["server_cpu_s"],
                                      "browsers_cpu_s": load1["browsers_cpu_s"] - load0["browsers_cpu_s"],
                                      "cores": os.cpu_count()}
                crossed = []
                for i, page in enumerate(pages):
                    strips = " ".join(page.evaluate(STRIP)).replace("·", " ").replace("↵", "\n")
                    mine = PROMPTS[i] if i < 2 else None
                    for prompt in PROMPTS:
                        if prompt != mine and prompt.split("\n")[0] in strips:
                            crossed.append((i, prompt.split("\n")[0]))
                    if mine is not None and (apps[i].state.trajectory.meta.get("messages") or [{}])[0].get(
                            "content", apps[i].state.trajectory.meta["prompt"]) != mine:
                        crossed.append((i, "own prompt missing"))
                out["crossed_state"] = crossed

            load_phase()
            # 3. recovery
            peak = max(sampler.rows, key=lambda row: row["rss_mib"])
            for page in pages[1:]:
                page.close()
            t_close = time.perf_counter()
            try:
                wait(lambda: operator.SESSIONS.open <= 1, timeout=args.release_timeout)
                out["sessions_released_s"] = time.perf_counter() - t_close
            except TimeoutError:
                out["sessions_released_s"] = None
            time.sleep(3)
            rec0 = sampler.sample("recovered")
            # is the memory of the closed sessions freed? drop this script's own references to their apps,
            # collect, count the apps still alive, and ask glibc to return free pages (malloc_trim)
            closed = [weakref.ref(a) for a in apps[1:]]
            del apps[1:], pages[1:]  # this script's own references to the closed sessions
            gc.collect()
            alive = sum(r() is not None for r in closed)
            try:
                ctypes.CDLL("libc.so.6").malloc_trim(0)
            except OSError:
                pass
            trimmed = sampler.sample("after gc + malloc_trim")
            out["recovered"] = summary([press(pages[0], apps[0]) for _ in range(args.idle_presses)])
            out["memory"] = {"idle_rss_mib": idle0["rss_mib"], "peak_rss_mib": peak["rss_mib"],
                             "recovered_rss_mib": rec0["rss_mib"], "after_trim_rss_mib": trimmed["rss_mib"],
                             "closed_sessions_apps_alive": f"{alive}/{len(closed)}", "idle_threads": idle0["threads"],
                             "peak_threads": max(row["threads"] for row in sampler.rows),
                             "recovered_threads": rec0["threads"]}
            browser.close()
    finally:
        sampler.stop()
        server.stop()
    t0 = sampler.rows[0]["t"] if sampler.rows else 0
    out["timeline"] = [{**row, "t": round(row["t"] - t0, 2)} for row in sampler.rows]
    print(json.dumps({k: v for k, v in out.items() if k != "timeline"}, indent=1))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
