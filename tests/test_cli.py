"""The command line: capture to run directories, progress, and one-line errors."""

from __future__ import annotations

import json

import polars as pl

import trajscope as ts
from trajscope.cli import main


def test_capture_one_prompt(tiny_dirs, tmp_path, capsys):
    rc = main(["capture", "--model", str(tiny_dirs["llama"]), "--prompt", "def f(x):", "--max-new-tokens", "4",
               "--no-eos", "--residual-layers", "all", "--out", str(tmp_path)])
    assert rc == 0
    (run,) = list(tmp_path.iterdir())
    traj = ts.Trajectory.load(run)
    assert traj.meta["n_generated"] == 4 and traj.residual(1).shape[0] == traj.prompt_len + 3
    assert str(run) in capsys.readouterr().err


def test_capture_prompt_file(tiny_dirs, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "import os", "id": "a"}) + "\n\n" + json.dumps("class B:") + "\n")
    out = tmp_path / "runs"
    assert main(["capture", "--model", str(tiny_dirs["gpt2"]), "--prompts", str(prompts), "--max-new-tokens", "3",
                 "--out", str(out), "--quiet"]) == 0
    tok = pl.scan_parquet(str(out / "*" / "tokens.parquet")).collect()
    assert tok["run_id"].n_unique() == 2 and "a" in set(tok["run_id"])


def test_errors_are_one_sentence(tiny_dirs, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{oops\n')
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    cases = [
        (["--model", "nope/nope-xyz", "--prompt", "x"], "Unknown model"),
        (["--model", str(tiny_dirs["llama"]), "--prompt", "x", "--max-new-tokens", "0"], "positive whole number"),
        (["--model", str(tiny_dirs["llama"]), "--prompt", "x", "--temperature", "nan"], "expected a finite number"),
        (["--model", str(tiny_dirs["llama"]), "--prompt", "x", "--temperature", "inf"], "expected a finite number"),
        (["--model", str(tiny_dirs["llama"]), "--prompt", "x", "--temperature", "-1"], "finite number ≥ 0"),
        (["--model", str(tiny_dirs["llama"]), "--prompt", "x", "--steer-strength", "nan"], "expected a finite number"),
        (["--model", str(tiny_dirs["llama"]), "--prompt", "x", "--temperature", "0.7", "--top-k", "-5"],
         "top_k must be a whole number ≥ 1, or 0 or None for no limit, not -5."),
        (["--prompts", str(bad)], "line 2: not valid JSON"),
        (["--prompts", str(empty)], "holds no prompts"),
        (["--prompt", "x", "--prompts", str(bad)], "exactly one of"),
        (["--model", str(tiny_dirs["llama"]), "--prompt", "x", "--residual-layers", "a,b"], "comma-separated"),
    ]
    for extra, fragment in cases:
        try:
            rc = main(["capture", *extra, "--out", str(tmp_path / "o")])
        except SystemExit as exit_:  # argparse's own error, for a flag its type refuses
            rc = exit_.code
        err = capsys.readouterr().err
        assert rc == 2, extra
        assert fragment in err and "Traceback" not in err, err


def test_steer_sweep_cli(tiny_dirs, tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps({"positive": f"x{i} = 'a'", "negative": f'x{i} = "a"'}) for i in range(3)))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def f(x):"}) + "\n")
    out = tmp_path / "sweep"
    rc = main(["steer-sweep", "--model", str(tiny_dirs["llama"]), "--pairs", str(pairs), "--layer", "1",
               "--prompts", str(prompts), "--depths", "1,3", "--strengths", "2,6", "--window", "3", "--out", str(out)])
    assert rc == 0
    summary = pl.read_parquet(out / "steering_summary.parquet")
    assert summary.height == 4 and set(summary["start_step"]) == {1, 3}
    assert pl.read_parquet(out / "steering.parquet")["kl_to_base"].null_count() == 0
    assert ts.SteeringVector.load(out / "vector.safetensors").layer == 1
    rc = main(["steer-sweep", "--model", str(tiny_dirs["llama"]), "--pairs", str(pairs), "--layer", "9",
               "--prompts", str(prompts), "--out", str(out)])
    assert rc == 2 and "layer 9 is out of range" in capsys.readouterr().err


def test_every_subcommand_help_has_a_description_defaults_and_an_example(capsys):
    import pytest

    from trajscope.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    sub.choices = {k: v for k, v in sub.choices.items()}
    assert {"capture", "serve", "report", "export", "steer-sweep", "profile", "drift", "harvest", "train-sae",
            "sae-drift"} <= set(sub.choices)
    for name, parser in sub.choices.items():
        with pytest.raises(SystemExit):
            main([name, "--help"])
        text = capsys.readouterr().out
        assert parser.description and "example:" in text and "trajscope " + name in text, name
        has_defaults = any(a.default not in (None, False) and a.help and a.dest != "help" for a in parser._actions)
        assert "(default:" in text or not has_defaults, name


def test_steered_capture_then_report(tmp_path, capsys):
    """The README's base/steered/report walk-through, on the sample model and its shipped vector."""
    from trajscope.model import sample_data_dir

    vec = sample_data_dir() / "vectors" / "quotes_caa_layer3.safetensors"
    base, steered = tmp_path / "base", tmp_path / "steered"
    common = ["capture", "--prompt", "x = ", "--max-new-tokens", "8", "--no-eos", "--quiet"]
    assert main(common + ["--out", str(base)]) == 0
    assert main(common + ["--steer", str(vec), "--steer-strength", "8", "--steer-start", "2", "--out", str(steered)]) == 0
    (b,), (s,) = list(base.iterdir()), list(steered.iterdir())
    meta = ts.Trajectory.load(s).meta
    assert meta["steering"][0]["start_step"] == 2 and meta["steering"][0]["strength"] == 8.0
    assert ts.Trajectory.load(b).meta["steering"] == []
    out = tmp_path / "r.html"
    assert main(["report", str(b), str(s), "-o", str(out)]) == 0
    assert out.exists() and "(2 runs;" in capsys.readouterr().err


def test_run_directories_are_flat_safe_and_readable(tiny_dirs, tmp_path):
    import os
    import stat

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "import os", "id": "lib/os.py:12"}) + "\n")
    out = tmp_path / "runs"
    old = os.umask(0o022)
    try:
        assert main(["capture", "--model", str(tiny_dirs["gpt2"]), "--prompts", str(prompts), "--max-new-tokens", "2",
                     "--residual-layers", "0", "--out", str(out), "--quiet"]) == 0
    finally:
        os.umask(old)
    (run,) = list(out.iterdir())
    assert run.name == "lib_os.py_12" and ":" not in run.name
    assert ts.Trajectory.load(run).run_id == "lib/os.py:12"
    assert stat.S_IMODE(run.stat().st_mode) == 0o755
    assert stat.S_IMODE((run / "tensors.safetensors").stat().st_mode) == 0o644


def test_report_profile_without_residuals_says_so_and_export_skips_bad(tiny_dirs, tmp_path, capsys):
    from trajscope.model import sample_data_dir

    out = tmp_path / "runs"
    assert main(["capture", "--prompt", "import os", "--max-new-tokens", "2", "--out", str(out), "--quiet"]) == 0
    (run,) = list(out.iterdir())
    capsys.readouterr()
    prof = sample_data_dir() / "profiles" / "trajscope-tiny.safetensors"
    assert main(["report", str(run), "--profile", str(prof), "-o", str(tmp_path / "r.html")]) == 0
    err = capsys.readouterr().err
    assert "kept residuals" in err and "(1 run;" in err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "meta.json").write_text("{not json")
    assert main(["export", str(run), str(bad), "--out", str(tmp_path / "ds")]) == 2
    assert main(["export", str(run), str(bad), "--skip-bad", "--out", str(tmp_path / "ds"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"left out {bad}" in err and "(1 run)" in err


def test_quiet_silences_weight_loading(tmp_path):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "trajscope.cli", "capture", "--prompt", "x", "--max-new-tokens", "1",
           "--out", str(tmp_path)]
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE")}
    loud = subprocess.run(cmd, capture_output=True, text=True, env=env)
    quiet = subprocess.run(cmd + ["--quiet"], capture_output=True, text=True, env=env)
    assert loud.returncode == quiet.returncode == 0
    assert "Loading weights" in loud.stderr and "Loading weights" not in quiet.stderr
