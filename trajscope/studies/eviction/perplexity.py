"""Held-out perplexity under KV eviction, the registered study ``eviction-ppl``.

The second measure the eviction papers report beside retrieval: how much worse does the model predict ordinary
text once a policy has compressed its prompt? Each held-out text's first ``prompt_len`` tokens are the prompt a
policy compresses after prefill; the next ``continuation`` tokens are teacher-forced with the evicted prompt keys
hidden from every later query (:func:`trajscope.studies.eviction.needle.heldout_perplexity`, the model boundary's
key mask). The number is the mean negative log-likelihood per continuation token (nats; perplexity is its
exponential), and its increase over the full cache on the same text.

**Held-out texts** (:func:`heldout_texts`): the running Python's standard-library source files, with the skip rules
of ``trajscope prepare``'s corpus (:mod:`trajscope.prepare.corpus`), taken from the *end* of its SHA-1 order of
paths: the build's prompt corpus reads the first 40 files of that order and its training harvest walks the same
order from the start (SmolLM2's shipped SAEs and profile read 74 groups, stdlib files and documentation topics
alternating), so files from the end are ones neither ever read. One text per file (its first ``prompt_len +
continuation`` tokens; shorter files are passed over), so the file is the unit of the intervals. Each row records
the file and its rank in that order (``sha1_rank``, 0 = first). SmolLM2 itself was pretrained on public code,
which may include these files: "held out" means held out from trajscope's own fitted artefacts, and the measure is
a paired difference on the same text.

:func:`perplexity_summary` is the one function that computes the study's numbers (the ``eviction_ppl_summary``
table): per policy and budget the mean NLL and the mean paired increase over the full cache, each with a 95%
bootstrap interval over files; the ``full`` row holds the full cache's NLL. At budget 1.0 every policy keeps every
key and its NLL equals the full cache's exactly (tested).
"""

from __future__ import annotations

import dataclasses
import pathlib
import sysconfig
import time
from typing import Any, Callable, Sequence

import polars as pl

from trajscope.errors import TrajscopeError

LEVEL = 0.95


def stdlib_order() -> list[str]:
    """Eligible standard-library source files (``trajscope prepare``'s skip rules) in its SHA-1 order of paths."""
    from trajscope.prepare.corpus import SKIP_DIRS, _h

    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    rels = (p.relative_to(root).as_posix() for p in root.rglob("*.py"))
    return sorted((r for r in rels if not any(part in SKIP_DIRS for part in r.split("/")[:-1])), key=_h)


def heldout_texts(model: Any, n_files: int, n_tokens: int) -> list[dict]:
    """``n_files`` texts of ``n_tokens`` tokens, one per standard-library file, from the end of the SHA-1 order.

    Returns:
        Dicts ``{"file", "sha1_rank", "ids"}``. Raises one sentence when fewer files are long enough.
    """
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    order = stdlib_order()
    out = []
    for rank in range(len(order) - 1, -1, -1):
        rel = order[rank]
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        if len(text) < n_tokens:  # fewer characters than tokens wanted: too short whatever the tokenizer
            continue
        ids = model.encode(text)
        if len(ids) >= n_tokens:
            out.append({"file": rel, "sha1_rank": rank, "ids": list(ids[:n_tokens])})
        if len(out) == n_files:
            return out
    raise TrajscopeError(f"Only {len(out)} standard-library files have {n_tokens} tokens; ask for fewer files "
                         f"(--n-files) or a shorter text (--prompt-len, --continuation).")


def perplexity_summary(rows: pl.DataFrame, level: float = LEVEL, n_boot: int = 2000) -> pl.DataFrame:
    """The ``eviction_ppl_summary`` table: per policy and budget, ``nll`` (mean over files) and ``delta_nll`` (mean
    paired increase over the full cache) with ``*_lo``/``*_hi`` bootstrap intervals over files, ``n_files``."""
    from trajscope.stats import cluster_bootstrap

    full = rows.filter(pl.col("policy") == "full").select("file", pl.col("nll").alias("full_nll"))
    paired = rows.join(full, on="file", how="inner").with_columns(delta=pl.col("nll") - pl.col("full_nll"))
    out = []
    for (policy, budget), g in paired.partition_by(["policy", "budget"], as_dict=True, maintain_order=True).items():
        files = g["file"].to_numpy()
        nll = cluster_bootstrap(g["nll"].to_numpy(), files, level=level, n_boot=n_boot)
        delta = cluster_bootstrap(g["delta"].to_numpy(), files, level=level, n_boot=n_boot)
        out.append({"policy": policy, "budget": float(budget), "nll": nll.estimate, "nll_lo": nll.lo,
                    "nll_hi": nll.hi, "delta_nll": delta.estimate, "delta_nll_lo": delta.lo,
                    "delta_nll_hi": delta.hi, "n_files": int(g.height),
                    "mean_kept_tokens": float(g["budget_tokens"].mean())})
    order = {"full": 0}
    return pl.DataFrame(out).sort([pl.col("policy").replace_strict(order, default=1), "policy", "budget"])


def run(model: Any, prompts: Any, config: Any, progress: Callable[[int, int], None] | None = None,
        layers: Sequence[int] | None = None) -> Any:
    """The registered ``eviction-ppl`` study on a
    :class:`~trajscope.studies.eviction.config.PerplexityConfig` (``prompts`` is not used: the study reads its
    held-out files itself).

    Returns:
        A :class:`~trajscope.studies.registry.Result` with ``eviction_ppl`` (one row per file × policy × budget,
        plus ``full``) and ``eviction_ppl_summary`` (:func:`perplexity_summary`; its rows are the summaries).
    """
    from trajscope.studies.eviction.needle import heldout_perplexity
    from trajscope.studies.registry import Result

    if layers:
        raise TrajscopeError("The eviction-ppl study evicts on every layer; leave out --layers.")
    t0 = time.perf_counter()
    texts = heldout_texts(model, config.n_files, config.prompt_len + config.continuation)
    rows = heldout_perplexity(model, [t["ids"] for t in texts], config.prompt_len, config.policies,
                              config.budget_values(), window=config.window, lookahead=config.lookahead,
                              progress=progress, pyramid_schedule=config.pyramid_schedule)
    meta = pl.DataFrame({"run_id": [str(i) for i in range(len(texts))], "file": [t["file"] for t in texts],
                         "sha1_rank": [t["sha1_rank"] for t in texts]})
    rows = rows.join(meta, on="run_id", how="left")
    table = perplexity_summary(rows)
    summaries = {f"{r['policy']}@{r['budget']:g}": {"value": r["delta_nll"], "lo": r["delta_nll_lo"],
                                                      "hi": r["delta_nll_hi"], "n": r["n_files"]}
                 for r in table.iter_rows(named=True) if r["policy"] != "full"}
    cfg = {**dataclasses.asdict(config), "model": model.describe(), "seconds": round(time.perf_counter() - t0, 1)}
    return Result(study="eviction-ppl", tables={"eviction_ppl": rows, "eviction_ppl_summary": table}, config=cfg,
                  summaries=summaries)
