"""The steering-success study: its criterion, its fluency number against Hugging Face, a planted behaviour, and one
headline number on the report and in the marker (``trajscope study steering-success``)."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch

from trajscope.errors import TrajscopeError
from trajscope.metrics import steering as M
from trajscope.studies.registry import Result, get
from trajscope.studies.steering_success import summary

PROMPTS = ["def fibonacci(n):\n    if n < 2:", "import os\nclass Loader:", "x = [1, 2, 3]\nprint(",
           "def parse(line):\n    return", "for i in range(10):\n   ", "with open('f') as fh:\n    data ="]


def _prompts(model):
    return [(f"file{i % 3}.py:{i}", model.encode(t)) for i, t in enumerate(PROMPTS)]


def _config(**kw):
    base = dict(sweep_layers=(3,), strengths=(4.0,), sweep_prompts=3, new_tokens=6, depths=(1, 3), window=3,
                depth_prompts=3, sae="none", n_boot=50, batch_size=4)
    return get("steering-success").config(**{**base, **kw})


# -- the criterion ---------------------------------------------------------------------------------------------------
def test_the_french_detector_on_known_sentences():
    fr = ["Pour faire une sauce tomate, il faut des tomates et de l'huile dans la poêle.",
          "Le matin, je me lève tôt et je bois un café avec du pain.",
          "Les villes sont pleines de vie, mais elles sont aussi très bruyantes."]
    en = ["To make a simple tomato sauce, you need tomatoes and some oil in the pan.",
          "In the morning, I get up early and drink a coffee with some bread.",
          "Cities are full of life, but they are also very noisy."]
    assert all(M.is_french(t) and M.french_score(t) > 0.5 for t in fr)
    assert not any(M.is_french(t) for t in en) and all(M.french_score(t) < -0.5 for t in en)
    assert not M.is_french("la la")  # fewer than MIN_FRENCH_WORDS
    assert not M.is_french("The sauce de la maison is the best in the city and it is very good.")  # mixed, mostly English
    assert M.language_counts("l’huile et le pain") == (2, 0)  # elision, typographic apostrophe
    assert M.french_score("") == 0.0 and M.french_score("la la la") == 1.0 and M.french_score("the the") == -1.0


def test_the_token_criterion():
    assert M.behaviour("", [5, 5, 7, 5], [5]) == (0.75, True)
    assert M.behaviour("", [7, 7, 5], [5])[1] is False and M.token_share([], [5]) == 0.0


# -- fluency against an independent computation -----------------------------------------------------------------------
def test_the_fluency_nll_equals_a_plain_hugging_face_forward(sample_model):
    """The study's NLL (left-padded batch, hooks, continuation logits) equals cross-entropy of one unpadded HF forward."""
    from trajscope.studies.steering_success.generate import continuation_logits, prefill, steered_greedy

    m = sample_model
    prompts = [m.encode(t) for t in PROMPTS[:4]]
    vec = _vector(m, 3, 4.0)
    pre = prefill(m, prompts, batch_size=3)
    conts = steered_greedy(m, pre, vec, 7)
    logits = continuation_logits(m, pre, conts, None)
    hf = m._local("test")
    for p, c, lg in zip(prompts, conts, logits):
        with torch.no_grad():
            ref = hf(input_ids=torch.tensor([p + c])).logits[0].double()
        want = float(torch.nn.functional.cross_entropy(ref[len(p) - 1:-1], torch.tensor(c)))
        assert M.mean_nll(lg, c) == pytest.approx(want, abs=2e-5)
        assert M.mean_nll(lg[2:], c[2:]) == pytest.approx(
            float(torch.nn.functional.cross_entropy(ref[len(p) + 1:-1], torch.tensor(c[2:]))), abs=2e-5)


def test_batched_steered_decoding_equals_capture(sample_model):
    """Left-padded batches with a forced prefix decode the tokens trajscope.capture decodes one prompt at a time."""
    import trajscope as ts
    from trajscope.studies.steering_success.generate import continuation_logits, prefill, steered_greedy

    m = sample_model
    prompts = [m.encode(t) for t in PROMPTS[:3]]
    vec = _vector(m, 3, 4.0)
    pre = prefill(m, prompts, batch_size=2)
    base = steered_greedy(m, pre, None, 8)
    late = vec.at(start_step=3)
    for v, out in ((vec, steered_greedy(m, pre, vec, 8)),
                   (late, steered_greedy(m, pre, late, 5, prefix=[c[:3] for c in base]))):
        for p, o in zip(prompts, out):
            ref = ts.capture(m, p, max_new_tokens=8, steering=[v], stop_at_eos=False)
            assert o == list(ref.token_ids[len(p):len(p) + 8])
    forced = continuation_logits(m, pre, base, late)  # teacher-forced, steered from step 3
    for p, c, lg in zip(prompts, base, forced):
        ref = m.forward(p + c, prompt_len=len(p), steering=[late]).logits[len(p) - 1:-1]
        assert torch.allclose(lg, ref, atol=1e-4)


def _vector(model, layer, strength, direction=None):
    from trajscope.steering import SteeringVector

    if direction is None:
        return SteeringVector.load("sample_data/vectors/quotes_caa_layer3.safetensors", strength=strength, start_step=1)
    return SteeringVector(layer=layer, direction=direction, strength=strength, start_step=1)


# -- a planted behaviour ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def planted(sample_model, tmp_path_factory):
    """A vector toward one token: its unembedding row, added at the last block."""
    m = sample_model
    target = " the"
    tid = m.tokenizer(target, add_special_tokens=False)["input_ids"]
    assert len(tid) == 1
    row = m._local("test").get_output_embeddings().weight[tid[0]].detach().float()
    path = tmp_path_factory.mktemp("planted") / "toward_the.npy"
    np.save(path, (row / row.norm()).numpy())
    neg = path.with_name("away_from_the.npy")
    np.save(neg, (-row / row.norm()).numpy())
    return {"target": target, "vector": str(path), "negated": str(neg), "layer": m.n_layers - 1}


def _planted_run(model, planted, vector, strength):
    cfg = _config(vector=vector, strength=strength, target=planted["target"], sweep_layers=(planted["layer"],),
                  strengths=(strength or 1.0,), pairs="sample_data/prompts/quotes_pairs.jsonl")
    from trajscope.steering import SteeringVector

    real = SteeringVector.load

    def load(path, layer=None, **kw):  # the .npy file carries no layer
        return real(path, layer=planted["layer"] if layer is None else layer, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SteeringVector, "load", staticmethod(load))
        return get("steering-success").run(model, _prompts(model), cfg)


def test_a_vector_toward_a_token_succeeds_and_strength_zero_does_not(sample_model, planted):
    strong = _planted_run(sample_model, planted, planted["vector"], 200.0)
    s = strong.summaries["success"]
    assert s["n"] == 6 and s["value"] >= 5 / 6 and s["lo"] > 0.3
    null = _planted_run(sample_model, planted, planted["vector"], 0.0)
    assert null.summaries["success"]["value"] == 0.0
    assert null.summaries["fluency"]["value"] == pytest.approx(0.0, abs=1e-6)  # the same text, the same model
    assert strong.summaries["fluency"]["value"] > 0.5  # a token loop is not what the model would write
    assert strong.summaries["anti_steerable"]["value"] == 0.0


def test_the_negated_vector_is_anti_steerable(sample_model, planted):
    away = _planted_run(sample_model, planted, planted["negated"], 200.0)
    assert away.summaries["success"]["value"] == 0.0
    a = away.summaries["anti_steerable"]
    assert a["n"] == 6 and a["value"] >= 5 / 6


# -- one number on every surface ---------------------------------------------------------------------------------------
SENTINEL, LO, HI = 0.7654321, 0.701, 0.802
SHOWN = "0.765 [0.701, 0.802]"


def test_the_success_rate_is_one_value_in_the_report_and_the_marker(sample_model, monkeypatch, tmp_path):
    real, calls = summary.arm_summary, []

    def fake(runs, *a, **kw):
        calls.append(1)
        hit = pl.col("arm") == "headline"
        return real(runs, *a, **kw).with_columns(
            *[pl.when(hit).then(pl.lit(v)).otherwise(pl.col(c)).alias(c)
              for c, v in (("success", SENTINEL), ("success_lo", LO), ("success_hi", HI))])

    monkeypatch.setattr(summary, "arm_summary", fake)
    result = get("steering-success").run(sample_model, _prompts(sample_model), _config())
    result.save(tmp_path)
    marker = json.loads((tmp_path / "steering-success.result.json").read_text())
    assert (marker["summaries"]["success"]["value"], marker["summaries"]["success"]["lo"]) == (SENTINEL, LO)
    _, html, _ = get("steering-success").section(Result.load(tmp_path, "steering-success"))
    assert html.count(SHOWN) >= 2  # the headline sentence and the by-arm table
    assert len(calls) == 1


def test_it_is_registered_with_its_artefacts_and_a_quick_preset():
    study = get("steering-success")
    assert dict(study.uses) == {"vector": "vector", "sae": "sae", "seen_prompt_files": "exclude_files"}
    cfg = study.config(**study.quick)
    assert cfg.new_tokens <= 8 and cfg.heldout_prompts <= 8 and len(cfg.sweep_layers) == 1


def test_bad_settings_are_one_sentence(sample_model):
    with pytest.raises(TrajscopeError, match="--strengths"):
        _config(strengths=(0.0,))
    with pytest.raises(TrajscopeError, match="no held-out prompt"):
        get("steering-success").run(sample_model, _prompts(sample_model),
                                    _config(exclude_files=("file0.py", "file1.py", "file2.py")))
    with pytest.raises(TrajscopeError, match="out of range"):
        get("steering-success").run(sample_model, _prompts(sample_model), _config(sweep_layers=(40,)))
