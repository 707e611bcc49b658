"""Batched harvest (``trajscope harvest --engine forward --batch-size N --padding-side …``).

Per sequence, a batched harvest has the same rows (tokens, tags, entropies to rounding) and the
same activations as the batch-1 harvest within the model's determinism floor
(:func:`trajscope.studies.determinism.measure_floor`, measured on the harvested sequences), for
left and right padding, prompts of different lengths and sampled continuations; the batch
settings are recorded in the harvest's meta. The capture engine refuses a batch in one sentence.
"""

from __future__ import annotations

import polars as pl
import pytest

from tiny import FAMILIES
from trajscope.errors import TrajscopeError
from trajscope.model.forward import numerics
from trajscope.features.harvest import harvest
from trajscope.studies.common import against_floor, deltas
from trajscope.studies.determinism import measure_floor

PROMPTS = [{"id": "a", "prompt": "def add(a, b):\n    return"}, {"id": "b", "prompt": "import os\nclass Foo:"},
           {"id": "c", "prompt": "x = 1"}, {"id": "d", "prompt": "for i in range(3):\n    print(i, i * 2)"}]


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_harvest_equals_batch_one_within_the_floor(tiny_models, family):
    model = tiny_models[family]
    with numerics(threads=1):
        one = harvest(model, PROMPTS, 1, max_new_tokens=5, n_sampled=1, engine="forward")
        seqs = [(f"s{r['seq']}", r["token_ids"][:-1]) for r in one.sequences.iter_rows(named=True)]
        floor = measure_floor(model, seqs, layers=[1])
        for side in ("left", "right"):
            many = harvest(model, PROMPTS, 1, max_new_tokens=5, n_sampled=1, engine="forward", batch_size=3,
                           padding_side=side)
            assert many.meta["serving"]["batch_size"] == 3 and many.meta["serving"]["padding_side"] == side
            assert many.sequences["token_ids"].to_list() == one.sequences["token_ids"].to_list()
            keys = ["seq", "prompt_id", "source", "pos", "step", "phase", "token_id", "next_id"]
            assert many.rows.select(keys).equals(one.rows.select(keys))
            assert (many.rows["entropy"] - one.rows["entropy"]).abs().max() < 1e-4
            d = pl.DataFrame(deltas({1: one.acts}, {1: many.acts})).with_columns(dtype=pl.lit(model.dtype))
            d = against_floor(d, floor)
            assert d["floor_rel_l2"].null_count() == 0 and not d["above_floor"].any(), (family, side)


def test_batched_prefill_only_harvest_and_errors(tiny_models):
    model = tiny_models["llama"]
    one = harvest(model, PROMPTS, 0, max_new_tokens=0, engine="forward")
    many = harvest(model, PROMPTS, 0, max_new_tokens=0, engine="forward", batch_size=4, padding_side="left")
    assert (many.rows["phase"] == "prefill").all() and many.rows.height == one.rows.height
    assert (many.acts - one.acts).norm() <= 1e-5 * one.acts.norm()
    with pytest.raises(TrajscopeError, match=r"^A batched harvest needs engine 'forward'"):
        harvest(model, PROMPTS, 0, max_new_tokens=2, batch_size=2)
    with pytest.raises(TrajscopeError, match=r"^The batch size must be at least 1"):
        harvest(model, PROMPTS, 0, max_new_tokens=2, engine="forward", batch_size=0)
    with pytest.raises(TrajscopeError, match=r"^padding_side must be 'left' or 'right'"):
        harvest(model, PROMPTS, 0, max_new_tokens=2, engine="forward", batch_size=2, padding_side="middle")


def test_harvest_command_passes_the_batch_through(tiny_dirs, tmp_path):
    import json

    from trajscope.cli import main
    from trajscope.features.harvest import Harvest

    pf = tmp_path / "p.jsonl"
    pf.write_text("\n".join(json.dumps(p) for p in PROMPTS), encoding="utf-8")
    out = tmp_path / "h"
    assert main(["harvest", "--model", str(tiny_dirs["gpt2"]), "--prompts", str(pf), "--layer", "0",
                 "--max-new-tokens", "2", "--n-sampled", "0", "--engine", "forward", "--batch-size", "2",
                 "--padding-side", "left", "--out", str(out), "--quiet"]) == 0
    assert Harvest.load(out).meta["serving"] == {"batch_size": 2, "padding_side": "left", "dtype": "float32",
                                                 "device": "cpu"}
    assert main(["harvest", "--model", str(tiny_dirs["gpt2"]), "--prompts", str(pf), "--layer", "0",
                 "--batch-size", "2", "--out", str(out), "--quiet"]) == 2


def test_right_padded_harvest_of_a_sliding_window_model(tmp_path):
    """Right padding inside a sliding window cannot decode exactly in a batch, so greedy continuations are
    generated alone there; the harvest still equals batch 1."""
    import trajscope as ts
    from tiny import build_tiny_model

    model = ts.load_model(str(build_tiny_model(tmp_path, "mistral", sliding_window=4)), device="cpu")
    assert model.sliding_window == 4
    one = harvest(model, PROMPTS, 1, max_new_tokens=4, n_sampled=0, engine="forward")
    many = harvest(model, PROMPTS, 1, max_new_tokens=4, n_sampled=0, engine="forward", batch_size=4,
                   padding_side="right")
    assert many.sequences["token_ids"].to_list() == one.sequences["token_ids"].to_list()
    assert (many.acts - one.acts).norm() <= 1e-5 * one.acts.norm()
