"""Leftovers of interrupted saves are cleaned at the next save, and never listed, reported or exported."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import trajscope as ts
from trajscope import leftovers
from trajscope.export import export
from trajscope.reports.comparison import compare
from trajscope.ui.saved_runs import list_runs


@pytest.fixture(scope="module")
def run(sample_model):
    return ts.capture(sample_model, "def f(x):\n", max_new_tokens=3, residual_layers=[0, 1])


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def hidden(d):
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


@pytest.mark.soak
def test_kill_9_mid_save_then_a_new_save_leaves_nothing_hidden(run, tmp_path):
    runs = tmp_path / "runs"
    run.save(runs / "first")
    src = tmp_path / "src"
    run.save(src)
    script = (f"import trajscope as ts, itertools\nt = ts.Trajectory.load({str(src)!r})\nprint('ready', flush=True)\n"
              f"for i in itertools.count(): t.save({str(runs)!r} + f'/run{{i % 2}}')\n")
    for delay in (0.3, 0.5, 0.7, 0.9):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # and one left over for certain, by a process that is gone
    partial = runs / f".run9.tmp-{dead_pid()}-abcd1234"
    partial.mkdir()
    (partial / "tokens.parquet").write_bytes(b"PAR1 half")
    assert partial.name in hidden(runs)
    assert all(leftovers.is_temporary(runs / h) for h in hidden(runs))
    assert len(list_runs(runs)) == len([d for d in runs.iterdir() if not d.name.startswith(".")])  # never listed
    compare([runs / h for h in hidden(runs)] + [runs / "first"])  # given explicitly: left out, not a failure
    export([runs / h for h in hidden(runs)] + [runs / "first"], tmp_path / "ds0", progress=False)

    run.save(runs / "next")  # the next save into that folder cleans up
    assert hidden(runs) == []
    visible = sorted(runs.iterdir())
    compare(visible)  # every entry is a whole run: no --skip-bad needed
    export(visible, tmp_path / "ds", progress=False)


def test_only_what_no_running_process_can_own_is_removed(tmp_path):
    now = time.time()
    mine = tmp_path / f".a.tmp-{os.getpid()}-x1"  # this process (another thread may be saving)
    live = tmp_path / f".b.tmp-{os.getppid()}-x2"  # a live process
    gone = tmp_path / f".c.tmp-{dead_pid()}-x3"
    old_aside = tmp_path / f".d.old-{dead_pid()}"
    legacy = tmp_path / ".e.ab12cd34"  # before the pid was in the name: only once it is ten minutes old
    foreign = tmp_path / ".config.abcdefgh"  # someone else's hidden folder: not run files
    git = tmp_path / ".git"
    elsewhere = tmp_path / f".f.tmp-{dead_pid()}@another.host-x4"  # another machine's save (a shared folder)
    for d in (mine, live, gone, old_aside, legacy, foreign, git, elsewhere):
        d.mkdir()
    (legacy / "meta.json").write_text("{}")
    (foreign / "settings.ini").write_text("")
    assert sorted(p.name for p in leftovers.clean(tmp_path, now=now)) == [gone.name, old_aside.name]
    assert sorted(p.name for p in leftovers.clean(tmp_path, now=now + leftovers.LEGACY_AGE_S + 1)) == [legacy.name]
    later = leftovers.clean(tmp_path, now=now + leftovers.MAX_AGE_S + 1)  # pids get reused: an hour is the bound
    assert sorted(p.name for p in later) == [mine.name, live.name, elsewhere.name]
    assert hidden(tmp_path) == [".config.abcdefgh", ".git"]


def test_a_save_names_its_temporary_directory_with_its_pid():
    assert leftovers.temp_prefix("r").startswith(f".r.tmp-{os.getpid()}@")
    assert leftovers.is_temporary(f"/x/{leftovers.temp_prefix('r')}abc") and not leftovers.is_temporary("/x/r")
    assert leftovers.is_temporary(f"/x/{leftovers.aside_name('r')}") and leftovers.is_temporary("/x/.r.old-12")
