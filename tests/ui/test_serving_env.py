"""The served app's process environment: set before torch loads, an operator's own value kept."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
# runs the app file as `panel serve` does (its module code), then reports what torch's process saw
PROBE = """
import os, runpy, sys
sys.argv = [os.environ["APP_FILE"]]  # no operator arguments
runpy.run_path(sys.argv[0], run_name="__main__")
import torch  # already loaded by the app file
print(os.environ.get("OMP_WAIT_POLICY"))
"""


def _run(env_extra: dict) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env.update(env_extra, HF_HUB_OFFLINE="1", APP_FILE=str(ROOT / "apps" / "trajscope.py"))
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_the_app_file_sets_the_passive_policy_before_torch_loads():
    src = (ROOT / "apps" / "trajscope.py").read_text()
    assert src.index("_serving_env().apply()") < src.index("import panel")  # before anything that loads torch
    assert _run({}) == "PASSIVE"


def test_an_operators_own_setting_is_kept():
    assert _run({"OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"


def test_apply_sets_only_what_is_unset():
    import importlib.util

    spec = importlib.util.spec_from_file_location("serving_env", ROOT / "trajscope" / "ui" / "serving_env.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert mod.apply(env) == {} and env == {"OMP_WAIT_POLICY": "ACTIVE"}
    env = {}
    assert mod.apply(env) == {"OMP_WAIT_POLICY": "PASSIVE"} == env
