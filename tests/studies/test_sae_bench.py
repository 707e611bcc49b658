"""The SAE bench study: registered with its quick preset, CE recovered equal to plain HF forward hooks, its
headline number from one function (sentinel), reproducibility counts, and the segment groups."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch

from trajscope.errors import TrajscopeError
from trajscope.studies import sae_bench
from trajscope.studies.registry import get, studies
from trajscope.studies.sae_bench import summary as S
from tests.sae.sae_helpers import tiny_sae
from tests.sae.test_ce_recovered import hooked_ce

SAES = ["--saes", "prefill-only=sample_data/saes/layer3-prefill-only,hybrid=sample_data/saes/layer3-hybrid,"
        "prefill-only=sample_data/saes/seeds/layer3-prefill-only-seed1"]
FAST = ["--max-per-file", "1", "--new-tokens", "6", "--max-prompt-tokens", "40", "--n-boot", "30", "--ks", "1,5"]
SENTINEL = 7777.0


@pytest.fixture(scope="module")
def small(sample_model):
    """The study on the sample model: one prompt from each of the 12 code files, 6 greedy steps, two mixes, two
    files named as the SAEs' training files."""
    cfg = sae_bench.SaeBenchConfig(saes=("prefill-only=sample_data/saes/layer3-prefill-only",
                                         "hybrid=sample_data/saes/layer3-hybrid"), max_per_file=1, new_tokens=6,
                                   max_prompt_tokens=40, n_boot=30, ks=(1, 5), sae_train_files=("gzip.py", "uu.py"))
    return cfg, sae_bench.run(sample_model, None, cfg)


def test_registered_with_flags_quick_preset_and_uses(capsys):
    from trajscope.cli import main

    study = get("sae-bench")
    assert study.config is sae_bench.SaeBenchConfig and "sae-bench" in studies()
    assert study.uses == {"sae": "saes", "prompt_files": "prompt_files", "seen_files": "sae_train_files"}
    assert set(study.quick) <= {f.name for f in __import__("dataclasses").fields(study.config)}
    sae_bench.SaeBenchConfig(**study.quick)  # the preset is a valid config
    with pytest.raises(SystemExit):
        main(["study", "sae-bench", "--help"])
    shown = capsys.readouterr().out
    assert "--prompt-files" in shown and "--ks" in shown and "--prompts " not in shown


def test_config_refuses_bad_values_in_one_sentence():
    with pytest.raises(TrajscopeError, match="--ks must be positive"):
        sae_bench.SaeBenchConfig(ks=(0,))
    with pytest.raises(TrajscopeError, match="--reproduce-cos"):
        sae_bench.SaeBenchConfig(reproduce_cos=1.5)
    with pytest.raises(TrajscopeError, match="NAME=DIR"):
        sae_bench.SaeBenchConfig(saes=("a=",))
    with pytest.raises(TrajscopeError, match="No prompt file matches"):
        from trajscope.studies.sae_bench.data import expand_files

        expand_files(["no/such/*.jsonl"])


def test_ce_recovered_equals_plain_hf_forward_hooks(small, sample_model):
    """Per group, CE recovered from the study equals (CE_zero − CE_sae) / (CE_zero − CE_clean) computed here with a
    forward hook on the HF module (not trajscope's splice), over the same sequences and positions."""
    from trajscope.sae.model import SAE
    from trajscope.studies.sae_drift import _sae_dir

    cfg, res = small
    core = res.table("sae-bench_core")
    sae = SAE.load(_sae_dir("sample_data/saes/layer3-hybrid"))
    hf = sample_model.torch_module()
    from trajscope.studies.sae_bench import data as D

    items = D.encode(sample_model, D.read_prompts(cfg.prompt_files, cfg.max_per_file), cfg.max_prompt_tokens)
    sums = {(ph, u): np.zeros(3) for ph in ("prefill", "decode") for u in (False, True)}
    for it in items:
        ids = sample_model.generate_ids(it["ids"], max_new_tokens=cfg.new_tokens, stop_at_eos=False)
        P = len(it["ids"])
        clean = hooked_ce(hf, ids, None, layer=3)
        zero = hooked_ce(hf, ids, torch.zeros_like, layer=3)
        spl = hooked_ce(hf, ids, lambda x: sae(x.float()).to(x.dtype), layer=3)
        pos = np.arange(1, len(ids) - 1)
        for ph, m in (("prefill", pos < P), ("decode", pos >= P)):
            for unseen in {False, it["file"] not in cfg.sae_train_files}:
                sums[(ph, unseen)] += [clean[m].sum(), zero[m].sum(), spl[m].sum()]
    for (ph, unseen), (c, z, s) in sums.items():
        row = core.filter((pl.col("kind") == ("all (unseen)" if unseen else "all")) & (pl.col("phase") == ph)
                          & (pl.col("segment") == "all") & (pl.col("mix") == "hybrid"))
        assert row["ce_recovered"][0] == pytest.approx((z - s) / (z - c), rel=1e-4)
        assert row["ce_recovered_lo"][0] < row["ce_recovered"][0] < row["ce_recovered_hi"][0]
    assert res.summaries["ce recovered decode hybrid"]["rows"] == "all (unseen)"
    assert res.summaries["ce recovered decode hybrid"]["value"] == pytest.approx(
        core.filter((pl.col("kind") == "all (unseen)") & (pl.col("phase") == "decode") & (pl.col("segment") == "all")
                    & (pl.col("mix") == "hybrid"))["ce_recovered"][0])


def test_probe_table_and_split_by_file(small):
    cfg, res = small
    probes = res.table("sae-bench_probe")
    info = res.summaries["setup"]["probe"]
    assert not set(info["fit_files"]) & set(info["evaluate_files"]) and len(info["evaluate_files"]) >= 2
    assert set(probes["eval_phase"]) == {"prefill", "decode"} and set(probes["k"]) >= {1, 5}
    k5 = probes.filter(pl.col("k") == 5)
    assert (k5["features"].list.len() == 5).all()
    ok = probes.filter(pl.col("auroc").is_not_nan())
    assert ((ok["auroc"] >= 0) & (ok["auroc"] <= 1)).all()


def test_the_headline_number_comes_from_one_function(tmp_path, monkeypatch, capsys):
    """``ce_recovered`` patched to plant a sentinel: the marker, the summary table, the printed summary and the report
    section all show it, so none of them computes the number itself."""
    from trajscope.cli import main
    from trajscope.reports.studies import study_report

    real = S.ce_recovered

    def patched(core):
        out = real(core)
        out["ce recovered decode prefill-only"] = {**out["ce recovered decode prefill-only"], "value": SENTINEL}
        return out

    monkeypatch.setattr(S, "ce_recovered", patched)
    out = tmp_path / "sb"
    assert main(["study", "sae-bench", *FAST, *SAES, "--out", str(out)]) == 0
    assert "7777" in capsys.readouterr().out
    marker = json.loads((out / "sae-bench.result.json").read_text())
    assert marker["summaries"]["ce recovered decode prefill-only"]["value"] == SENTINEL
    table = pl.read_parquet(out / "sae-bench_summary.parquet")
    assert table.filter(pl.col("summary") == "ce recovered decode prefill-only")["value"].to_list() == [SENTINEL]
    html = study_report([out], tmp_path / "r.html").read_text()
    assert "7777.000 [" in html
    # unpatched, the number is the core table's seed mean of the decode rows
    core = pl.read_parquet(out / "sae-bench_core.parquet")
    dec = core.filter((pl.col("kind") == "all") & (pl.col("phase") == "decode") & (pl.col("segment") == "all")
                      & (pl.col("mix") == "prefill-only"))
    assert dec.height == 2  # two seed replicates
    honest = real(core)["ce recovered decode prefill-only"]
    assert honest["value"] == pytest.approx(dec["ce_recovered"].mean()) != SENTINEL
    assert honest["seed_min"] == pytest.approx(dec["ce_recovered"].min())
    assert "reproduced prefill-only s0→s1" in marker["summaries"]


def test_reproducibility_counts_decoder_matches():
    from trajscope.studies.sae_bench.core import reproducibility

    a = tiny_sae(d_in=16, d_sae=32, k=4, seed=1)
    b = tiny_sae(d_in=16, d_sae=32, k=4, seed=1)
    c = tiny_sae(d_in=16, d_sae=32, k=4, seed=2)
    with torch.no_grad():
        b.W_dec[:10] = -b.W_dec[:10]  # 10 features flipped: cosine -1, not reproduced
    alive = {k: torch.ones(32, dtype=torch.bool) for k in (("m", 0), ("m", 1), ("m", 2))}
    alive[("m", 0)][10:14] = False  # 4 reproduced features never fire on the rows
    t = reproducibility({("m", 0): a, ("m", 1): b, ("m", 2): c}, alive, 0.9)
    ab = t.filter((pl.col("seed") == 0) & (pl.col("other_seed") == 1)).row(0, named=True)
    assert ab["n_reproduced"] == 22 and ab["n_alive"] == 28 and ab["n_reproduced_alive"] == 18
    ac = t.filter((pl.col("seed") == 0) & (pl.col("other_seed") == 2)).row(0, named=True)
    assert ac["n_reproduced"] < 5  # random decoders in 16 dimensions rarely reach 0.9


def test_groups_split_chat_rows_by_segment():
    from trajscope.studies.sae_bench.core import groups

    rows = pl.DataFrame({"kind": ["chat"] * 5 + ["code"] * 2,
                         "phase": ["prefill", "prefill", "prefill", "decode", "decode", "prefill", "decode"],
                         "segment": ["system", "user", "assistant", "assistant", "assistant", "user", "assistant"]})
    got = {(k, p, s): int(m.sum()) for k, p, s, m in groups(rows)}
    assert got[("all", "prefill", "all")] == 4 and got[("all", "decode", "all")] == 3
    assert got[("chat", "prefill", "system")] == 1 and got[("chat", "decode", "assistant")] == 2
    assert ("code", "prefill", "user") not in got and got[("code", "prefill", "all")] == 1
    seen = {(k, p, s): int(m.sum()) for k, p, s, m in groups(rows.with_columns(
        pl.Series("seen", [True, True, False, False, True, False, False])))}
    assert seen[("chat (unseen)", "prefill", "assistant")] == 1 and seen[("all (unseen)", "decode", "all")] == 2
    assert ("chat (unseen)", "prefill", "system") not in seen and seen[("code (unseen)", "prefill", "all")] == 1


def test_the_shipped_smollm2_report_is_a_result_its_section_reads():
    import pathlib

    from trajscope.studies.registry import Result

    shipped = pathlib.Path(__file__).resolve().parents[2] / "sample_data" / "smollm2" / "report" / "sae-bench"
    res = Result.load(shipped, "sae-bench")
    assert get("sae-bench").holds(shipped)
    title, body, figs = get("sae-bench").section(res)
    s = res.summaries["ce recovered decode prefill-only"]
    assert s["rows"] == "all (unseen)" and f"{s['value']:.3f} [{s['lo']:.3f}, {s['hi']:.3f}]" in body
    assert "0.963 [0.940, 0.982]" in body  # as docs/studies/sae.md and the README state it
    again = S.summarize(res.table("sae-bench_core"), res.table("sae-bench_diff"), res.table("sae-bench_probe"),
                        res.table("sae-bench_repro"))
    assert {k: v for k, v in res.summaries.items() if k != "setup"} == again
