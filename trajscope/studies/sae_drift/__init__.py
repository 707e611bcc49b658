"""The SAE drift study: does an SAE fitted on prefill activations still reconstruct decode activations?

A registered study (:mod:`trajscope.studies.registry`, ``trajscope study sae-drift``). The prompt
set is harvested at the SAEs' layer (:func:`trajscope.features.harvest.harvest`: the prompt
positions from 1 on, and a greedy plus ``n_sampled`` sampled continuations per prompt), then every
SAE of every training mix (seed replicates of one mix share its name) encodes every row:
:func:`trajscope.features.reconstruction.reconstruction_report` gives reconstruction by phase,
decode depth, entropy band and position bin with prompt-clustered intervals, the seed spread,
each mix against the first, and prefill-vs-decode feature overlap beside a matched-n null.

- :class:`SaeDriftConfig`: the frozen config (its fields are the command's flags);
- :func:`run`: harvest the prompts, then :func:`evaluate`; :func:`evaluate` does the second half
  on a saved harvest (what ``trajscope sae-drift --harvest DIR``, the older command, runs);
- the Result's tables: ``sae-drift`` (every metric per row group, SAE and seed),
  ``sae-drift_seeds``, ``sae-drift_diff``, ``sae-drift_overlap`` and ``sae-drift_summary``; its
  summaries come from :func:`trajscope.studies.sae_drift.summary.summarize` alone, with
  ``summaries["setup"]`` holding how it ran (layer, rows, prompts, mixes, resamples, and under
  ``harvest`` the harvest's own settings: on a saved harvest those, not the config's harvest
  fields, are what applied);
- :func:`~trajscope.studies.sae_drift.section.section`: the report section, reading the Result only.

The study has no app card of its own: the SAE features card shows the run on screen, encoded
with one SAE, not this study's numbers.
"""

from __future__ import annotations

import dataclasses
import pathlib
from dataclasses import field
from typing import Any, Callable, Sequence

from trajscope.errors import TrajscopeError
from trajscope.studies.registry import Result, Study, register
from trajscope.studies.sae_drift import summary as S
from trajscope.studies.sae_drift.section import section

NAME = "sae-drift"
TABLES = {"drift": NAME, "seeds": f"{NAME}_seeds", "diffs": f"{NAME}_diff", "overlap": f"{NAME}_overlap"}
SAMPLE_SAES = ("prefill-only=sample_data/saes/layer3-prefill-only", "hybrid=sample_data/saes/layer3-hybrid")


def _help(text: str, **more: Any) -> dict[str, Any]:
    return {"help": text, **more}


def parse_saes(items: Sequence[str]) -> dict[str, list[str]]:
    """``("NAME=DIR", "DIR", "NAME=DIR2")`` → ``{name: [dirs]}`` in first-seen order; a repeated name adds a
    seed replicate to that mix, a bare ``DIR`` is named by its last path part (an existing directory whose path
    holds ``=`` is a bare ``DIR``)."""
    out: dict[str, list[str]] = {}
    for item in items:
        name, sep, path = str(item).partition("=")
        if not sep or pathlib.Path(item).is_dir():
            name, path = pathlib.PurePath(item).name, item
        if not name.strip() or not path.strip():
            raise TrajscopeError(f"'{item}' is not an SAE: write NAME=DIR or DIR.")
        out.setdefault(name.strip(), []).append(path.strip())
    if not out:
        raise TrajscopeError("The study needs at least one SAE (NAME=DIR).")
    return out


@dataclasses.dataclass(frozen=True)
class SaeDriftConfig:
    """SAE reconstruction and feature overlap, prefill vs decode, for SAEs of one or more training mixes."""

    saes: tuple[str, ...] = field(default=SAMPLE_SAES, metadata=_help(
        "NAME=DIR (or DIR) of SAELens-format SAEs; a NAME given again adds a seed replicate of that training mix "
        "(their spread is the noise floor); the first NAME is the base of differences"))
    max_new_tokens: int = field(default=128, metadata=_help("decode steps per continuation of the harvest"))
    n_sampled: int = field(default=1, metadata=_help("sampled continuations per prompt, besides the greedy one"))
    temperature: float = field(default=0.8, metadata=_help("temperature of the sampled continuations"))
    top_p: float = field(default=0.95, metadata=_help("top-p of the sampled continuations"))
    batch_size: int = field(default=8, metadata=_help("sequences per reading forward of the harvest"))
    overlap_k: int = field(default=64, metadata=_help("top-k-by-frequency feature set size of the overlap"))
    n_boot: int = field(default=1000, metadata=_help("prompt-bootstrap resamples per interval"))
    n_null: int = field(default=200, metadata=_help("prefill-vs-prefill draws per matched-n null"))
    seed: int = field(default=0, metadata=_help("seed of the sampled continuations and of every resampling"))
    no_splice: bool = field(default=False, metadata=_help("skip the spliced forward (no KL / CE increase)"))

    def __post_init__(self) -> None:
        parse_saes(self.saes)
        for name in ("batch_size", "overlap_k", "n_boot", "n_null"):
            if getattr(self, name) < 1:
                raise TrajscopeError(f"--{name.replace('_', '-')} must be at least 1, not {getattr(self, name)}.")
        for name in ("max_new_tokens", "n_sampled"):
            if getattr(self, name) < 0:
                raise TrajscopeError(f"--{name.replace('_', '-')} must be 0 or more, not {getattr(self, name)}.")
        if not self.temperature > 0 or not 0 < self.top_p <= 1:
            raise TrajscopeError(f"--temperature must be above 0 and --top-p in (0, 1], not {self.temperature} and "
                                 f"{self.top_p}.")


HARVEST_FIELDS = ("max_new_tokens", "n_sampled", "temperature", "top_p")


def with_harvest_settings(config: SaeDriftConfig, meta: dict[str, Any]) -> SaeDriftConfig:
    """``config`` with its harvest fields set to what a saved harvest's ``meta`` says it was made with."""
    found = {k: meta[k] for k in HARVEST_FIELDS if isinstance(meta.get(k), (int, float))}
    if isinstance((meta.get("serving") or {}).get("batch_size"), int):
        found["batch_size"] = meta["serving"]["batch_size"]
    return dataclasses.replace(config, **found)


def _sae_dir(path: str) -> str:
    """``path``, or for a ``sample_data/…`` path absent from the working directory, the shipped copy."""
    p = pathlib.Path(path)
    if not p.exists() and p.parts[:1] == ("sample_data",):
        from trajscope.model.load import sample_data_dir

        shipped = sample_data_dir().joinpath(*p.parts[1:])
        if shipped.exists():
            return str(shipped)
    return path


def load_saes(config: SaeDriftConfig) -> dict[str, list[Any]]:
    """The config's SAEs by mix name, loaded; one sentence when they do not read one layer."""
    from trajscope.sae.model import SAE

    saes = {name: [SAE.load(_sae_dir(p)) for p in paths] for name, paths in parse_saes(config.saes).items()}
    layers = {int(s.cfg.layer) for reps in saes.values() for s in reps}
    if len(layers) != 1:
        raise TrajscopeError(f"The SAEs read different layers ({sorted(layers)}); compare SAEs of one layer.")
    return saes


def evaluate(harvest: Any, config: SaeDriftConfig, model: Any = None, progress: Callable[[int, int], None] | None = None,
             saes: dict[str, list[Any]] | None = None) -> Result:
    """The study on a harvest already made: encode it with every SAE and build the Result.

    Args:
        harvest: a :class:`~trajscope.features.harvest.Harvest` at the SAEs' layer.
        config: the study's config.
        model: the model for the spliced-in KL / CE increase (None, or ``config.no_splice``: skipped).
        progress: ``(done, total)`` while splicing, per SAE.
        saes: the config's SAEs already loaded (default: :func:`load_saes`).
    Returns:
        The Result (tables named in the module docstring; summaries from :func:`summarize`).
    """
    from trajscope.features.reconstruction import reconstruction_report

    saes = saes if saes is not None else load_saes(config)
    splice_cb = (lambda label, done, total: progress(done, total)) if progress is not None else None
    rep = reconstruction_report(harvest, saes, model=None if config.no_splice else model, overlap_k=config.overlap_k,
                                n_boot=config.n_boot, n_null=config.n_null, seed=config.seed, progress=splice_cb)
    setup = {**rep.info, "harvest": {k: v for k, v in harvest.meta.items() if k != "split"}}
    summaries = {"setup": setup, **S.summarize(rep.seeds, rep.diffs, rep.overlap)}
    tables = {TABLES["drift"]: rep.drift, TABLES["seeds"]: rep.seeds, TABLES["diffs"]: rep.diffs,
              TABLES["overlap"]: rep.overlap, f"{NAME}_summary": S.summary_table(summaries)}
    return Result(study=NAME, tables=tables, config=dataclasses.asdict(config), summaries=summaries)


def run(model: Any, prompts: Sequence[tuple[str, list[int]]], config: SaeDriftConfig,
        progress: Callable[[int, int], None] | None = None, layers: Sequence[int] | None = None) -> Result:
    """Harvest ``prompts`` at the SAEs' layer, then :func:`evaluate`.

    Args:
        model: a :class:`~trajscope.model.ModelHandle`.
        prompts: ``(prompt_id, token ids)`` pairs (:func:`trajscope.studies.prompts.encode_prompts`).
        config: the study's config.
        progress: ``(done, total)`` over the harvest's sequences, then per SAE over the spliced ones.
        layers: when given, must hold the SAEs' layer (the SAEs fix the layer).
    Returns:
        The Result.
    """
    from trajscope.features.harvest import harvest

    saes = load_saes(config)
    layer = int(next(iter(saes.values()))[0].cfg.layer)
    if layers and layer not in set(map(int, layers)):
        raise TrajscopeError(f"The SAEs read layer {layer}, which --layers ({', '.join(map(str, layers))}) leaves out.")
    items = [{"prompt": list(ids), "id": pid} for pid, ids in prompts]
    h = harvest(model, items, layer, max_new_tokens=config.max_new_tokens, n_sampled=config.n_sampled,
                temperature=config.temperature, top_p=config.top_p, seed=config.seed, engine="forward",
                batch_size=config.batch_size, on_capture=progress)
    return evaluate(h, config, model, progress, saes=saes)


def report_text(result: Result, metrics: Sequence[str] = ("fvu", "cos", "kl", "ce_increase", "dead", "dense")) -> str:
    """The plain-text report of a Result (what ``trajscope sae-drift`` prints), from its tables and setup."""
    from trajscope.features.reconstruction import SAEReport, format_report

    rep = SAEReport(drift=result.table(TABLES["drift"]), seeds=result.table(TABLES["seeds"]),
                    diffs=result.table(TABLES["diffs"]), overlap=result.table(TABLES["overlap"]),
                    info=dict(result.summaries.get("setup") or {}))
    return format_report(rep, metrics=metrics)


STUDY = register(Study(
    name=NAME, question="SAE reconstruction and feature overlap, prefill vs decode, for SAEs of one or more training "
                        "mixes", config=SaeDriftConfig, run=run, section=section, uses={"sae": "saes"},
    # a short pass: greedy continuations only, no spliced forwards (sae-bench measures CE recovered)
    quick={"max_prompts": 8, "max_tokens": 64, "max_new_tokens": 16, "n_sampled": 0, "no_splice": True, "n_boot": 200,
           "n_null": 20},
    example=f"trajscope study {NAME} --prompts sample_data/prompts/heldout_code.jsonl --out studies/sae-drift "
            "--saes prefill-only=sample_data/saes/layer3-prefill-only,hybrid=sample_data/saes/layer3-hybrid"))
