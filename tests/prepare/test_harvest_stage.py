"""The training harvest of ``trajscope prepare``: more rows, from training source files only, sink left out."""

from __future__ import annotations

import pathlib

import polars as pl
import torch

from trajscope.prepare import Context, stages
from trajscope.prepare.config import PrepareConfig
from trajscope.prepare.corpus import stdlib_items, training_sources, windows
from trajscope.prepare.harvest_stage import evaluate_groups
from trajscope.prepare.sae_stage import harvest_pools, layer_rows

PROMPTS = str(pathlib.Path(__file__).resolve().parents[2] / "sample_data" / "smollm2" / "prompts")


def test_training_sources_leave_out_the_evaluate_files_and_alternate_kinds():
    first = [it["group"] for it in stdlib_items(6, 1, 400)]
    held = {first[1], first[4], "pydoc:try"}
    src = training_sources(held, max_chars=300)
    groups = [s["group"] for s in src]
    assert not held & set(groups) and len(groups) == len(set(groups))
    assert [s["kind"] for s in src[:4]] == ["stdlib", "docs", "stdlib", "docs"]
    stdlib_order = [g for g in groups if not g.startswith("pydoc:")]
    assert stdlib_order[:4] == [first[0], first[2], first[3], first[5]]  # the corpus's files first, same order
    assert all(len(s["text"]) <= 300 for s in src)


def test_windows_are_consecutive_token_slices(sample_model):
    src = [{"group": "a", "kind": "stdlib", "text": "def f(x):\n    return x + 1\n" * 40},
           {"group": "b", "kind": "docs", "text": "The quick brown fox jumps over the lazy dog. " * 40}]
    wins = windows(sample_model, src, 16, 8, 20, 3, 5)
    ids_a = sample_model.encode(src[0]["text"])
    assert [w["group"] for w in wins] == ["a", "a", "a", "b", "b"]
    assert [w["offset"] for w in wins[:3]] == [8, 28, 48] and wins[1]["ids"] == ids_a[28:44]
    assert all(len(w["ids"]) == 16 for w in wins)


def _fake_collect(out: pathlib.Path, held: list[str], d_model: int) -> None:
    from safetensors.torch import save_file

    (out / "collect").mkdir(parents=True)
    groups = held + ["chat_math.jsonl", "some/other.py"]
    parts = ["evaluate"] * len(held) + ["fit", "calibrate"]
    rows = pl.DataFrame({"group": groups, "part": parts, "phase": ["prefill"] * len(groups)})
    rows.write_parquet(out / "collect" / "rows.parquet")
    save_file({"acts": torch.randn(len(groups), d_model)}, str(out / "collect" / "acts.safetensors"))
    (out / "collect" / "DONE.json").write_text("{}")


def test_harvest_stages_read_training_files_only(tmp_path, sample_model, monkeypatch):
    monkeypatch.setattr(sample_model.tokenizer, "chat_template",
                        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:", raising=False)
    first = [it["group"] for it in stdlib_items(4, 1, 400)]
    held = [first[0], first[2], "chat_cooking.jsonl", "pydoc:try"]
    _fake_collect(tmp_path, held, sample_model.d_model)
    cfg = PrepareConfig(prompts_dir=PROMPTS, layer=1, harvest_seq_tokens=24, harvest_per_source=2,
                        harvest_prefill_rows=120, harvest_decode_prompt_tokens=10, harvest_decode_new_tokens=6,
                        harvest_decode_per_source=1, harvest_decode_rows=30, harvest_batch=4)
    assert [s.name for s in stages(cfg)][2:4] == ["harvest-prefill", "harvest-decode"]
    ctx = Context(cfg, tmp_path, "sample")
    ctx.__dict__["model"] = sample_model
    ctx.__dict__["meta"] = {}
    from trajscope.prepare.stages import run_stages

    run_stages(tmp_path, [s for s in stages(cfg) if s.name.startswith("harvest")], ctx, log=lambda s: None)
    assert evaluate_groups(tmp_path) == set(held)
    pre = layer_rows(tmp_path / "harvest-prefill")
    dec = layer_rows(tmp_path / "harvest-decode")
    for acts, rows in (pre, dec):
        assert acts.shape == (rows.height, sample_model.d_model) and acts.dtype == torch.float16
        assert not set(rows["group"].to_list()) & set(held) and rows["pos"].min() == cfg.first_pos
    assert pre[1].height >= 120 and (pre[1]["phase"] == "prefill").all() and pre[1]["pos"].max() == 23
    d = dec[1]
    assert (d["phase"] == "decode").sum() > 0 and (d["kind"] == "chat").any()
    # a window's continuation: decode rows follow its prompt rows, the step is the query step
    assert d.filter(pl.col("seq") == 0)["kind"][0] == "chat"  # chat prompts first: a time budget keeps them
    windows_only = d.filter(pl.col("kind") != "chat")
    first_seq = windows_only.filter(pl.col("seq") == windows_only["seq"].min())
    assert first_seq.filter(pl.col("phase") == "prefill")["pos"].to_list() == list(range(1, 10))
    assert first_seq.filter(pl.col("phase") == "decode")["step"].to_list()[:2] == [1, 2]
    h_pre, h_dec, info = harvest_pools(tmp_path)
    assert h_pre.shape[0] == pre[1].height + (d["phase"] == "prefill").sum() and h_dec.dtype == torch.float32
    assert info["harvest-decode"]["decode_rows"] == int((d["phase"] == "decode").sum())
    # a harvested prefill row is the model's own block output at that position (batch-1 forward)
    win = windows(sample_model, training_sources(set(held), 8 * 3 * 24), 24, 0, 24, 2, 1)[0]
    ref = sample_model.forward(win["ids"], layers=[1]).resid[1][1:].float()
    got = pre[0][:23].float()
    assert pre[1]["token_id"].to_list()[:23] == win["ids"][1:]
    assert torch.allclose(got, ref, atol=2e-3 * float(ref.abs().max()), rtol=2e-3)


def test_training_pools_leave_out_rows_with_a_massive_activation():
    from trajscope.prepare.sae_stage import drop_massive

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, 32, generator=g)
    x[7, 3], x[2000, 0] = 24_000.0, -5_000.0  # sink-like rows: |x| > 100 and > 1000 × the median |x|
    x[11, 5] = 90.0  # large, but under the absolute bar
    kept, n = drop_massive(x)
    assert n == 2 and kept.shape[0] == 2998 and float(kept.abs().max()) == 90.0
    assert drop_massive(x[:0])[1] == 0
