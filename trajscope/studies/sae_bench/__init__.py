"""The SAE bench study: SAEs measured as SAEBench measures them, by phase (prefill, decode) and chat segment.

A registered study (``trajscope study sae-bench``). Chat and code prompts (JSON-lines files; a
prompt's source file is its ``file`` field or the head of its id) are harvested at the SAEs' layer
with greedy continuations (:mod:`~trajscope.studies.sae_bench.data`), then every SAE (training mix ×
seed replicate) is measured:

- SAEBench's core metrics by phase and segment — CE loss recovered normalised by zero-ablation,
  explained variance, L0, dead and dense features — with bootstrap intervals over source files and
  each mix against the first, paired (:mod:`~trajscope.studies.sae_bench.core`);
- k-sparse probing of token labels computed from the text (string literal, keyword, indented line,
  digit), fitted on prefill rows of some code files and scored on prefill and decode rows of the
  others, with a dense-residual ceiling (:mod:`~trajscope.studies.sae_bench.probing`);
- reproducibility: how many features of one seed have a decoder match of cosine ≥ ``reproduce_cos``
  in another seed of the same mix (and in the other mix at the same seed).

Tables: ``sae-bench_core``, ``sae-bench_diff``, ``sae-bench_probe``, ``sae-bench_repro``,
``sae-bench_summary``; summaries from :mod:`~trajscope.studies.sae_bench.summary`, with
``summaries["setup"]`` holding how it ran. The section (:mod:`~trajscope.studies.sae_bench.section`)
reads the Result only. The prepare stage ``sae-eval`` measures the same core metrics on the build's
own held-out rows; this study measures them on any prompt set, by segment, with probing.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import field
from typing import Any, Callable, ClassVar, Sequence

from trajscope.errors import TrajscopeError
from trajscope.studies.registry import Result, Study, register
from trajscope.studies.sae_bench import summary as S
from trajscope.studies.sae_bench.section import section

NAME = "sae-bench"
TABLES = ("core", "diff", "probe", "repro")
SAMPLE_SAES = ("prefill-only=sample_data/saes/layer3-prefill-only", "hybrid=sample_data/saes/layer3-hybrid")
SMOLLM2_FILES = ("sample_data/smollm2/prompts/chat_*.jsonl", "sample_data/prompts/heldout_code.jsonl")


def _help(text: str, **more: Any) -> dict[str, Any]:
    return {"help": text, **more}


@dataclasses.dataclass(frozen=True)
class SaeBenchConfig:
    """SAEBench's core metrics and k-sparse probing by phase and segment, and feature reproducibility."""

    OWN_INPUT: ClassVar[str] = "chat and code prompt files from --prompt-files (paths or globs)"

    saes: tuple[str, ...] = field(default=SAMPLE_SAES, metadata=_help(
        "NAME=DIR (or DIR) of SAELens-format SAEs of one layer; a NAME given again adds a seed replicate of that "
        "training mix; the first NAME is the base of differences"))
    prompt_files: tuple[str, ...] = field(default=("sample_data/prompts/heldout_code.jsonl",), metadata=_help(
        "JSON-lines prompt files or globs: chat prompts (\"messages\") give segments, text prompts are code "
        "(probing labels)"))
    sae_train_files: tuple[str, ...] = field(default=(), metadata=_help(
        "source files the SAEs were trained on: every group is also reported over the other files alone "
        "(kind '... (unseen)'), and the headline numbers use those"))
    max_per_file: int = field(default=8, metadata=_help("prompts per source file at most"))
    max_prompt_tokens: int = field(default=96, metadata=_help("cut code prompts to their first N tokens (chat "
                                                              "prompts are never cut)"))
    new_tokens: int = field(default=32, metadata=_help("greedy decode steps per prompt"))
    batch_size: int = field(default=8, metadata=_help("sequences per batched generate and reading forward"))
    ks: tuple[int, ...] = field(default=(1, 2, 5, 20), metadata=_help("k of the k-sparse probes (SAEBench's "
                                                                       "top-k by mean difference)"))
    reproduce_cos: float = field(default=0.9, metadata=_help("decoder cosine at which a feature counts as "
                                                             "reproduced"))
    n_boot: int = field(default=1000, metadata=_help("bootstrap resamples of source files per interval"))
    seed: int = field(default=0, metadata=_help("seed of the file split, the probes' balancing and resampling"))
    no_splice: bool = field(default=False, metadata=_help("skip the spliced forwards (no CE recovered)"))

    def __post_init__(self) -> None:
        from trajscope.studies.sae_drift import parse_saes

        parse_saes(self.saes)
        if not self.prompt_files:
            raise TrajscopeError("--prompt-files names no file.")
        for name in ("max_per_file", "batch_size", "n_boot"):
            if getattr(self, name) < 1:
                raise TrajscopeError(f"--{name.replace('_', '-')} must be at least 1, not {getattr(self, name)}.")
        for name in ("new_tokens", "max_prompt_tokens"):
            if getattr(self, name) < 0:
                raise TrajscopeError(f"--{name.replace('_', '-')} must be 0 or more, not {getattr(self, name)}.")
        if not self.ks or min(self.ks) < 1:
            raise TrajscopeError(f"--ks must be positive integers, not {','.join(map(str, self.ks)) or 'nothing'}.")
        if not 0 < self.reproduce_cos <= 1:
            raise TrajscopeError(f"--reproduce-cos must be in (0, 1], not {self.reproduce_cos}.")


def load_saes(config: SaeBenchConfig) -> dict[tuple[str, int], Any]:
    """``{(mix, seed index): SAE}`` of the config (seed index: the replicate's order within its mix)."""
    from trajscope.studies.sae_drift import _sae_dir, parse_saes
    from trajscope.sae.model import SAE

    out = {(mix, i): SAE.load(_sae_dir(p)) for mix, paths in parse_saes(config.saes).items()
           for i, p in enumerate(paths)}
    layers = {int(s.cfg.layer) for s in out.values()}
    if len(layers) != 1:
        raise TrajscopeError(f"The SAEs read different layers ({sorted(layers)}); compare SAEs of one layer.")
    return out


def run(model: Any, prompts: Any, config: SaeBenchConfig, progress: Callable[[int, int], None] | None = None,
        layers: Sequence[int] | None = None) -> Result:
    """Harvest the config's prompt files at the SAEs' layer and measure every SAE (module docstring).

    Args:
        model: a :class:`~trajscope.model.ModelHandle`.
        prompts: unused (the study reads ``config.prompt_files``; the CLI passes None).
        config: the study's config.
        progress: ``(done, total)`` over the harvest's sequences, then over the spliced sequences.
        layers: when given, must hold the SAEs' layer.
    Returns:
        The Result.
    """
    import polars as pl
    import torch

    from trajscope.studies.sae_bench import core as C
    from trajscope.studies.sae_bench import data as D
    from trajscope.studies.sae_bench.probing import probe_table

    t0 = time.perf_counter()
    saes = load_saes(config)
    layer = int(next(iter(saes.values())).cfg.layer)
    if layers and layer not in set(map(int, layers)):
        raise TrajscopeError(f"The SAEs read layer {layer}, which --layers ({', '.join(map(str, layers))}) leaves out.")
    if any(int(s.cfg.d_in) != model.d_model for s in saes.values()):
        raise TrajscopeError(f"The SAEs read width {next(iter(saes.values())).cfg.d_in}, but the model's residual is "
                             f"{model.d_model} wide; give SAEs trained on this model.")
    items = D.encode(model, D.read_prompts(config.prompt_files, config.max_per_file), config.max_prompt_tokens)
    h = D.harvest_rows(model, items, layer, new_tokens=config.new_tokens, batch_size=config.batch_size,
                       progress=progress)
    h.rows = h.rows.with_columns(pl.col("file").is_in(list(config.sae_train_files)).alias("seen"))
    t_harvest = time.perf_counter() - t0
    codes = {key: C.encode_all(sae, h.acts) for key, sae in saes.items()}
    ce = None
    if not config.no_splice:
        ce = C.ce_table(model, {f"{m}-s{s}": sae for (m, s), sae in saes.items()}, h.sequences, layer, progress)
    core, diffs = C.core_tables(h.acts, h.rows, codes, ce, n_boot=config.n_boot, seed=config.seed)
    probes, probe_info = probe_table(h.acts, h.rows, {k: f for k, (_, f) in codes.items()}, config.ks,
                                     n_boot=config.n_boot, seed=config.seed)
    alive = {k: (f > 0).any(0) for k, (_, f) in codes.items()}
    repro = C.reproducibility(saes, alive, config.reproduce_cos)
    del codes
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    summaries = {"setup": {
        "model_id": model.model_id, "layer": layer, "n_prompts": len(items), "n_rows": h.rows.height,
        "n_files": h.rows["file"].n_unique(), "kinds": sorted(set(h.rows["kind"].to_list())),
        "sae_train_files": sorted(set(config.sae_train_files) & set(h.rows["file"].to_list())),
        "unseen_files": sorted(set(h.rows["file"].to_list()) - set(config.sae_train_files)),
        "mixes": {m: sorted(s for mm, s in saes if mm == m) for m in dict.fromkeys(m for m, _ in saes)},
        "sae_dirs": list(config.saes), "first_pos": 1, "new_tokens": config.new_tokens, "n_boot": config.n_boot,
        "level": 0.95, "probe": probe_info, "reproduce_cos": config.reproduce_cos,
        "seconds": {"harvest": round(t_harvest, 1), "total": round(time.perf_counter() - t0, 1)}},
        **S.summarize(core, diffs, probes, repro)}
    tables = {f"{NAME}_core": core, f"{NAME}_diff": diffs, f"{NAME}_probe": probes, f"{NAME}_repro": repro,
              f"{NAME}_summary": S.summary_table(summaries)}
    return Result(study=NAME, tables=tables, config=dataclasses.asdict(config), summaries=summaries)


STUDY = register(Study(
    name=NAME, question="SAEBench's core metrics and k-sparse probing by phase and chat segment, and feature "
                        "reproducibility across seeds",
    config=SaeBenchConfig, run=run, section=section, marker=f"{NAME}_summary.parquet",
    example=(f"trajscope study {NAME} --model smollm2 --prompt-files {','.join(SMOLLM2_FILES)} --saes "
             "prefill-only=sample_data/smollm2/saes/layer15-prefill-only,hybrid=sample_data/smollm2/saes/"
             "layer15-hybrid --out reports/sae-bench"),
    uses={"sae": "saes", "prompt_files": "prompt_files", "seen_files": "sae_train_files"},
    quick={"max_per_file": 1, "max_prompt_tokens": 48, "new_tokens": 8, "ks": (1, 5),
           "n_boot": 100}))

__all__ = ["SaeBenchConfig", "run", "section", "STUDY"]
