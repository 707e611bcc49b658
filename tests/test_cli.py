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
        (["--prompts", str(bad)], "line 2: not valid JSON"),
        (["--prompts", str(empty)], "holds no prompts"),
        (["--prompt", "x", "--prompts", str(bad)], "exactly one of"),
        (["--model", str(tiny_dirs["llama"]), "--prompt", "x", "--residual-layers", "a,b"], "comma-separated"),
    ]
    for extra, fragment in cases:
        rc = main(["capture", *extra, "--out", str(tmp_path / "o")])
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
    summary = pl.read_parquet(out / "summary.parquet")
    assert summary.height == 4 and set(summary["start_step"]) == {1, 3}
    assert pl.read_parquet(out / "steps.parquet")["kl_to_base"].null_count() == 0
    assert ts.SteeringVector.load(out / "vector.safetensors").layer == 1
    rc = main(["steer-sweep", "--model", str(tiny_dirs["llama"]), "--pairs", str(pairs), "--layer", "9",
               "--prompts", str(prompts), "--out", str(out)])
    assert rc == 2 and "layer 9 is out of range" in capsys.readouterr().err
