"""The serving studies, registered: determinism floor, batch composition, chunked prefill, prefix
cache and SAE stability under serving modes.

Each is a :class:`~trajscope.studies.registry.Study`: a frozen config whose fields carry their
help (the flags of ``trajscope study NAME``), a run that calls
:func:`trajscope.studies.run.run_study` and returns a Result of its tables, and a report section
(:mod:`trajscope.studies.serving.sections`) that reads the Result only. The headline numbers
have one home, :func:`trajscope.studies.serving.summary.headline`, stored in ``Result.summaries``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any, Callable

from trajscope.errors import TrajscopeError
from trajscope.studies.registry import Result, Study, register
from trajscope.studies.serving import sections

PROMPTS = "sample_data/prompts/heldout_code.jsonl"


def _help(text: str, **more: Any) -> dict[str, Any]:
    return {"help": text, **more}


@dataclasses.dataclass(frozen=True)
class DeterminismConfig:
    """The noise floor: repeats, deterministic algorithms, threads, TF32 and precision choices."""

    dtypes: tuple[str, ...] | None = field(default=None, metadata=_help(
        "dtypes to compare (default: float32, bfloat16, float16 where the device runs them)"))
    repeats: int = field(default=2, metadata=_help("repeated runs per prompt and dtype"))

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise TrajscopeError(f"--repeats must be at least 1, not {self.repeats}.")


@dataclasses.dataclass(frozen=True)
class BatchConfig:
    """A prompt alone vs co-batched."""

    batch_size: int = field(default=4, metadata=_help("rows per batch (the prompt plus neighbours)"))
    padding: tuple[str, ...] = field(default=("left", "right"), metadata=_help("padding sides to run"))
    neighbours: tuple[str, ...] = field(default=("shorter", "longer", "mixed", "copies"), metadata=_help(
        "neighbour kinds: shorter, longer, mixed, copies (identical-input control)"))
    slots: tuple[str, ...] = field(default=("first", "last"), metadata=_help("the prompt's row in the batch"))


@dataclasses.dataclass(frozen=True)
class ChunkedPrefillConfig:
    """Prefill in chunks vs one pass."""

    chunks: tuple[int, ...] = field(default=(1, 4, 16, 64), metadata=_help("chunk sizes in tokens"))

    def __post_init__(self) -> None:
        from trajscope.studies.prefill import check_chunks

        check_chunks(list(self.chunks))


@dataclasses.dataclass(frozen=True)
class PrefixCacheConfig:
    """A shared prefix served from a cache vs recomputed."""

    header: str | None = field(default=None, metadata=_help(
        "text prepended to every prompt to give the set a shared prefix ('default': a fixed system prompt / "
        "license header); without it the prompts must already share one"))
    cold: bool = field(default=False, metadata=_help("start with an empty cache (default: the shared prefix is warm)"))
    block: int = field(default=1, metadata=_help("cache block size in tokens (vLLM: 16)"))
    min_shared: int = field(default=4, metadata=_help("tokens the whole set must share"))


@dataclasses.dataclass(frozen=True)
class SaeStabilityConfig:
    """SAEs trained on harvests that differ only by serving mode, against the seed-to-seed spread."""

    header: str = field(default="default", metadata=_help(
        "shared prefix prepended to every prompt ('default': the fixed system prompt; 'none': the prompts already "
        "share one or prefix-cache is not among --modes)"))
    layer: int = field(default=3, metadata=_help("block whose output the SAEs read"))
    modes: tuple[str, ...] = field(default=("reference", "batch", "bfloat16", "prefix-cache"), metadata=_help(
        "serving modes: reference (always), batch, bfloat16, prefix-cache"))
    seeds: tuple[int, ...] = field(default=(0, 1, 2), metadata=_help("SAE training seeds (same budget each)"))
    d_sae: int = field(default=512, metadata=_help("SAE width"))
    k: int = field(default=16, metadata=_help("active features (TopK)"))
    n_tokens: int = field(default=256_000, metadata=_help("training rows per SAE (the budget)"))
    serve_batch: int = field(default=16, metadata=_help("batch size of the batch mode"))
    padding_side: str = field(default="left", metadata=_help("padding of the batch mode", choices=("left", "right")))

    def stability(self) -> Any:
        """The :class:`~trajscope.studies.sae_stability.StabilityConfig` the study runs with."""
        from trajscope.studies.sae_stability import StabilityConfig

        return StabilityConfig(layer=self.layer, modes=tuple(self.modes), seeds=tuple(self.seeds), d_sae=self.d_sae,
                               k=self.k, n_tokens=self.n_tokens, serve_batch=self.serve_batch,
                               padding_side=self.padding_side)


def _options(name: str, config: Any) -> dict[str, Any]:
    """``run_study``'s keywords for ``config``."""
    if name == "batch":
        return {"batch_size": config.batch_size, "sides": list(config.padding), "neighbours": list(config.neighbours),
                "slots": list(config.slots)}
    if name == "determinism":
        return {"dtypes": list(config.dtypes) if config.dtypes else None, "repeats": config.repeats}
    if name == "chunked-prefill":
        return {"chunks": list(config.chunks)}
    if name == "sae-stability":
        return {"config": config.stability()}
    return {"warm": not config.cold, "block": config.block, "min_shared": config.min_shared}


def _runner(name: str) -> Callable[..., Result]:
    def run(model: Any, prompts: Any, config: Any, progress: Any = None, layers: Any = None) -> Result:
        from trajscope.studies.run import run_study

        from trajscope.studies.serving.summary import headline

        tables = run_study(name, model, prompts, layers=layers, progress=progress, **_options(name, config))
        result = Result(study=name, tables=tables, config=dataclasses.asdict(config))
        result.summaries = headline(result)  # the one home of the headline numbers (the section shows them)
        return result

    run.__doc__ = f"Run the {name} study; its tables in a Result."
    return run


for _name, _config, _section, _example in (
        ("determinism", DeterminismConfig, sections.determinism_section, "--out reports/serving --dtypes float32,bfloat16"),
        ("batch", BatchConfig, sections.batch_section, "--out reports/serving"),
        ("chunked-prefill", ChunkedPrefillConfig, sections.chunked_prefill_section, "--out reports/serving --chunks 1,8,32"),
        ("prefix-cache", PrefixCacheConfig, sections.prefix_cache_section, "--out reports/serving --header default"),
        ("sae-stability", SaeStabilityConfig, sections.sae_stability_section, "--out reports/serving --max-prompts 96")):
    _prompts = "sample_data/prompts/heldout_chunks.jsonl" if _name == "sae-stability" else PROMPTS
    _doc = (_config.__doc__ or _name).strip().rstrip(".")
    register(Study(name=_name, question=_doc if _doc[:2].isupper() else _doc[0].lower() + _doc[1:], config=_config,
                   run=_runner(_name), section=_section, family="serving",
                   example=f"trajscope study {_name} --prompts {_prompts} {_example}",
                   shared_defaults={"max_prompts": 96} if _name == "sae-stability" else {}))
