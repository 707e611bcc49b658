"""``trajscope prepare``: build a real model's assets (drift profile, SAEs, steering vectors) in one resumable run.

Stages, in order (each writes ``OUT/<stage>/`` and a marker; see :mod:`.stages`):

1. ``collect`` (:mod:`.collect`): greedy continuations of the offline corpus
   (:mod:`.corpus`) with every layer's residuals;
2. ``profile`` (:mod:`.profile_stage`): a drift profile fitted and calibrated on
   disjoint source files, with its per-position FPR by layer on the evaluate files;
3. ``harvest-prefill``, ``harvest-decode`` (:mod:`.harvest_stage`): many more layer rows
   (prefill windows; greedy continuations) from training source files only;
4. ``sae-<mix>-s<seed>`` (:mod:`.sae_stage`): TopK SAEs at one layer, prefill-only
   and hybrid, each seed, on the collect stage's training rows plus the harvests;
5. ``sae-eval`` (:mod:`.sae_eval_stage`): FVU, explained variance, L0, dead/dense and CE loss
   recovered by phase on the evaluate files, reproducibility across seeds, and the feature
   index of seed 0 of the prefill-only SAE;
6. ``steer`` (:mod:`.steer_stage`): a CAA vector (answer in French), layer and strength
   picked on sweep prompts, success rate and fluency cost on held-out prompts.

Position 0 (the attention sink) is excluded from every stage (``first_pos``), and every
artefact's metadata records it together with the model id and a hash of its weights.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import pathlib
from typing import Any

import torch

from trajscope.positions import SINK_POS, sink_meta
from trajscope.prepare.config import PrepareConfig
from trajscope.prepare.stages import Stage, run_stages

SINK_NOTE = ("positions before first_pos (position 0, the attention sink: |x| ~ 29,000 at layers 11-27 of SmolLM2) "
             "are excluded from fitting, training and evaluation")


def weights_hash(model: Any) -> str:
    """SHA-256 (first 16 hex digits) over the model's weight tensors in name order (float32 bytes), read from the
    ``*.safetensors`` files of its directory; the boundary's :meth:`revision` where there is no directory."""
    from safetensors import safe_open

    files = sorted(pathlib.Path(model.source_path).glob("*.safetensors")) if model.source_path else []
    if not files:
        return f"revision:{model.revision()}"
    where = {}
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            where.update({name: f for name in fh.keys()})
    h = hashlib.sha256()
    for name in sorted(where):
        with safe_open(str(where[name]), framework="pt") as fh:
            h.update(name.encode())
            h.update(fh.get_tensor(name).float().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class Context:
    """What every stage reads: the settings, the output directory and the (lazily loaded) model."""

    def __init__(self, cfg: PrepareConfig, out: pathlib.Path, model_source: str):
        self.cfg, self.out, self.model_source = cfg, pathlib.Path(out), model_source

    @functools.cached_property
    def model(self) -> Any:
        from trajscope.model.load import load_model

        torch.set_num_threads(self.cfg.threads)
        return load_model(self.model_source)

    @functools.cached_property
    def meta(self) -> dict:
        """Provenance written into every artefact (read from ``collect/meta.json`` once that exists)."""
        saved = self.out / "collect" / "meta.json"
        if saved.is_file():
            return json.loads(saved.read_text(encoding="utf-8"))
        m = self.model
        return {"model_name": self.cfg.model_id, "model_source": self.model_source,
                "weights_sha256_16": weights_hash(m), "n_layers": m.n_layers, "d_model": m.d_model,
                "first_pos": self.cfg.first_pos, "sink_treatment": SINK_NOTE,
                **sink_meta(self.cfg.first_pos > SINK_POS)}


MIXES = ("prefill-only", "hybrid")
HARVESTS = ("prefill", "decode")


def sae_name(mix: str, seed: int) -> str:
    """The stage (and directory) name of one SAE."""
    return f"sae-{mix}-s{seed}"


def _lazy(module: str, *args: Any):
    """A stage function importing its module when it runs."""
    def fn(ctx, d):
        return importlib.import_module(f"trajscope.prepare.{module}").run(ctx, d, *args)
    return fn


def stages(cfg: PrepareConfig = PrepareConfig()) -> list[Stage]:
    """The stages of a build, in order."""
    harvest = [Stage(f"harvest-{which}", _lazy("harvest_stage", which),
                     f"layer-{cfg.layer} {which} rows of the training source files") for which in HARVESTS]
    saes = [Stage(sae_name(mix, seed), _lazy("sae_stage", mix, seed), f"train the {mix} TopK SAE, seed {seed}")
            for mix in MIXES for seed in cfg.seeds]
    return [Stage("collect", _lazy("collect"), "greedy continuations and residuals of the corpus"),
            Stage("profile", _lazy("profile_stage"), "drift profile split by source file"),
            *harvest,
            *saes,
            Stage("sae-eval", _lazy("sae_eval_stage"), "SAE metrics, reproducibility across seeds, feature index"),
            Stage("steer", _lazy("steer_stage"), "CAA vector: layer sweep, success and fluency on held-out prompts")]


def prepare(model_source: str, out: str | pathlib.Path, cfg: PrepareConfig = PrepareConfig(),
            only: list[str] | None = None) -> dict[str, str]:
    """Run (or resume) the build into ``out``; ``only`` restricts it to the named stages."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1), encoding="utf-8")
    todo = [s for s in stages(cfg) if only is None or s.name in only]
    return run_stages(out, todo, Context(cfg, out, model_source))
