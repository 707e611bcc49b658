"""SAE stability under serving modes, on a tiny model and small budgets.

- known answers: an SAE against itself matches every feature (cosine 1, Jaccard 1, ΔFVU 0);
  a permuted copy still matches everything through the decoder match (indices differ);
- the per-row FVU shares average to :func:`reconstruction_stats`' FVU (the bootstrap reads the
  same number the metric module reports);
- the study end to end: batch mode differs from the reference harvest by rounding only, so its
  same-seed SAEs agree to rounding; the prefix-cache harvest lacks exactly the shared-prefix rows;
- the command writes its four tables with schema metadata; bad settings give one sentence.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import polars as pl
import pytest
import torch

from trajscope.errors import TrajscopeError
from trajscope.metrics.sae_eval import reconstruction_stats
from trajscope.model.forward import numerics
from trajscope.sae.model import SAE, SAEConfig
from trajscope.studies import sae_stability as S
from trajscope.studies.flags import register
from trajscope.studies.prompts import encode_prompts, shared_prefix_len

TEXTS = ["def fibonacci(n):\n    return n", "import os\nimport sys", "class A:\n    pass\n\n\nclass B:\n    x = 1",
         "for i in range(10):\n    print(i)", "while True:\n    break", "x = [1, 2, 3]\ny = x[0]"]
HEADER = "# System: answer with short Python.\n# License: PSF.\n"
SMALL = dict(seeds=(0, 1), d_sae=32, k=4, n_tokens=4096, batch_size=128, n_boot=200, layer=1, eval_fraction=0.5)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with numerics(threads=1):
        yield


def _sae(seed=0, d_in=16, d_sae=24):
    return SAE(SAEConfig(architecture="topk", d_in=d_in, d_sae=d_sae, k=4, hook_name="blocks.0.hook_resid_post"),
               seed=seed)


def test_decoder_match_and_row_jaccard_known_answers():
    a = _sae()
    perm = torch.randperm(a.d_sae, generator=torch.Generator().manual_seed(1))
    maxcos, match = S.decoder_match(a.W_dec.detach(), a.W_dec.detach()[perm])
    assert torch.allclose(maxcos, torch.ones_like(maxcos)) and torch.equal(match, perm)
    x = torch.randn(50, 16, generator=torch.Generator().manual_seed(2))
    f = a.encode(x).detach()
    assert (S.row_jaccards(f, f[:, perm], match) == 1).all()
    # disjoint active sets give 0; half-overlapping sets give 1/3
    fa = torch.zeros(2, 6); fa[:, [0, 1]] = 1
    fb = torch.zeros(2, 6); fb[0, [2, 3]] = 1; fb[1, [1, 2]] = 1
    assert S.row_jaccards(fa, fb, torch.arange(6)).tolist() == pytest.approx([0.0, 1 / 3])


def test_fvu_rows_average_to_the_metric_modules_fvu():
    sae = _sae()
    x = torch.randn(80, 16, generator=torch.Generator().manual_seed(3)) * 3 + 1
    e = S._evaluate(sae, x)
    rows = S._fvu_rows(e, x, np.ones(80, bool))
    x_hat, f = sae.reconstruct(x)
    assert rows.mean() == pytest.approx(reconstruction_stats(x, x_hat, f)["fvu"], rel=1e-9)


def _prompts(model, texts=TEXTS):
    return encode_prompts(model, [{"prompt": HEADER + t, "id": f"p{i}"} for i, t in enumerate(texts)], None)


def test_study_on_a_tiny_model(tiny_models):
    model = tiny_models["llama"]
    prompts = _prompts(model)
    cfg = S.StabilityConfig(**SMALL, serve_batch=3)
    out = S.sae_stability_study(model, prompts, cfg)
    assert set(out) == {"sae-stability_harvests", "sae-stability_saes", "sae-stability_pairs", "sae-stability_summary"}
    harv = out["sae-stability_harvests"]
    shared = shared_prefix_len([ids for _, ids in prompts])
    pc = harv.filter(pl.col("mode") == "prefix-cache").row(0, named=True)
    assert pc["n_reused"] == shared * len(prompts) and pc["prefix_cache"]
    ref = harv.filter(pl.col("mode") == "reference").row(0, named=True)
    assert ref["n_reused"] == 0 and ref["rel_l2_vs_reference"] == 0
    assert harv.filter(pl.col("mode") == "bfloat16")["rel_l2_vs_reference"][0] > 1e-4
    pairs = out["sae-stability_pairs"]
    same_batch = pairs.filter((pl.col("mode") == "batch") & (pl.col("kind") == "same_seed"))
    # the batched harvest differs from the reference by rounding only, so same-seed SAEs agree to rounding
    assert harv.filter(pl.col("mode") == "batch")["rel_l2_vs_reference"][0] < 1e-5
    assert (same_batch["row_jaccard"] > 0.99).all() and (same_batch["fvu_delta"].abs() < 1e-5).all()
    assert (same_batch["dec_maxcos"] > 1 - 1e-4).all()
    assert pairs.filter(pl.col("kind") == "seed").height == 1
    assert pairs.filter(pl.col("kind") == "cross_seed").height == 3 * 2
    summ = out["sae-stability_summary"]
    assert set(summ["metric"]) == set(S.METRICS)
    iv = summ.filter(pl.col("kind") != "seed")
    assert iv["lo"].is_nan().sum() == 0 and ((iv["lo"] <= iv["value"] + 1e-12) & (iv["value"] <= iv["hi"] + 1e-12)).all()
    saes = out["sae-stability_saes"]
    assert set(saes["region"]) == {"all", "shared", "own"}
    assert saes.filter(pl.col("region") == "all")["n_prompts"].unique().to_list() == [ref["n_eval_prompts"]]


def test_clear_errors(tiny_models):
    model = tiny_models["llama"]
    plain = encode_prompts(model, [{"prompt": t, "id": f"p{i}"} for i, t in enumerate(TEXTS)], None)
    with pytest.raises(TrajscopeError, match=r"^The prompts share a prefix of only 0 token"):
        S.sae_stability_study(model, plain, S.StabilityConfig(**SMALL))
    with pytest.raises(TrajscopeError, match=r"^Give at least two distinct seeds"):
        S.sae_stability_study(model, _prompts(model), S.StabilityConfig(**{**SMALL, "seeds": (0, 0)}))
    with pytest.raises(TrajscopeError, match=r"^Unknown serving mode 'fp8'"):
        S.sae_stability_study(model, _prompts(model), S.StabilityConfig(**{**SMALL, "modes": ("reference", "fp8")}))
    with pytest.raises(TrajscopeError, match=r"^Layer 7 is out of range"):
        S.sae_stability_study(model, _prompts(model), S.StabilityConfig(**{**SMALL, "layer": 7}))


def test_command_writes_tables_with_metadata(tiny_dirs, tmp_path, capsys):
    pf = tmp_path / "p.jsonl"
    pf.write_text("\n".join(json.dumps({"prompt": t, "id": f"p{i}"}) for i, t in enumerate(TEXTS)), encoding="utf-8")
    parser = argparse.ArgumentParser(prog="trajscope")
    register(parser.add_subparsers(dest="command"))
    out = tmp_path / "out"
    args = parser.parse_args(["study", "sae-stability", "--model", str(tiny_dirs["gpt2"]), "--prompts", str(pf),
                              "--out", str(out), "--layer", "1", "--seeds", "0,1", "--d-sae", "32", "--k", "4",
                              "--n-tokens", "2048", "--modes", "reference,batch,prefix-cache", "--serve-batch", "2"])
    assert args.max_prompts == 96 and args.func(args) == 0
    for name in ("harvests", "saes", "pairs", "summary"):
        meta = pl.read_parquet_metadata(out / f"sae-stability_{name}.parquet")
        assert meta["trajscope_table"] == f"serving_sae-stability_{name}" and "trajscope_schema" in meta
    assert "verdict" in capsys.readouterr().out
    assert set(pl.read_parquet(out / "sae-stability_harvests.parquet")["mode"]) == {"reference", "batch", "prefix-cache"}
    # the headline numbers: one function (serving.summary.headline), in the marker and in the report section
    from trajscope.reports.studies import sections
    from trajscope.studies.registry import Result
    from trajscope.studies.serving import summary
    from trajscope.studies.serving.sections import ci

    written = json.loads((out / "sae-stability.result.json").read_text())["summaries"]
    assert written == json.loads(json.dumps(summary.headline(Result.load(out, "sae-stability"))))
    html = sections()["sae-stability"](out)[1]
    for e in written.values():
        assert ci(e["value"], e["lo"], e["hi"], e["n"]) in html


def test_reference_must_be_float32_and_study_dtype_errors(tiny_dirs, tmp_path):
    import trajscope as ts

    bf = ts.load_model(str(tiny_dirs["llama"]), device="cpu", dtype="bfloat16")
    with pytest.raises(TrajscopeError, match=r"^The reference harvest runs in float32"):
        S.sae_stability_study(bf, _prompts(bf), S.StabilityConfig(**SMALL))
    pf = tmp_path / "p.jsonl"
    pf.write_text("\n".join(json.dumps({"prompt": t}) for t in TEXTS), encoding="utf-8")
    parser = argparse.ArgumentParser(prog="trajscope")
    register(parser.add_subparsers(dest="command"))
    for study in ("batch", "sae-stability"):
        args = parser.parse_args(["study", study, "--model", str(tiny_dirs["llama"]), "--prompts", str(pf),
                                  "--out", str(tmp_path / "o"), "--dtype", "float8_e4m3fn"])
        with pytest.raises(TrajscopeError, match=r"^The cpu device cannot run float8_e4m3fn"):
            args.func(args)
    args = parser.parse_args(["study", "sae-stability", "--model", str(tiny_dirs["llama"]), "--prompts", str(pf),
                              "--out", str(tmp_path / "o"), "--header", "none", "--layer", "1"])
    with pytest.raises(TrajscopeError, match=r"^The prompts share a prefix of only"):
        args.func(args)
