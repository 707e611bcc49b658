"""The SAE bench study's k-sparse probes: fitted on prefill rows of some code files, scored on others.

Code prompts' source files are split in two (:func:`trajscope.stats.split_ids` with the files as
groups): ``fit`` and ``evaluate``. Per label (:data:`trajscope.metrics.sae_code_labels.LABELS`), per
SAE and per k: the probe of :mod:`trajscope.metrics.sae_probing` is fitted on the balanced prefill
rows of the fit files (features chosen there by mean difference), then scored on the prefill rows
and on the decode rows of the evaluate files, each with its AUROC and balanced accuracy and a
bootstrap over evaluate files. The dense ceiling (``probe = "residual"``, ``k`` = d_model) is the same
regression on the standardised residual. A label with fewer than ``min_positives`` positive (or
negative) prefill rows in the fit files is left out and named in the Result's setup.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import polars as pl
import torch

from trajscope.metrics import sae_probing as SP
from trajscope.metrics.sae_code_labels import LABELS
from trajscope.stats import split_ids


def split_files(rows: pl.DataFrame, seed: int) -> dict[str, list[str]]:
    """``{"fit": files, "evaluate": files}``: the code rows' source files in two halves (needs two files)."""
    files = sorted(set(rows.filter(pl.col("kind") == "code")["file"].to_list()))
    if len(files) < 2:
        return {"fit": files, "evaluate": []}
    return split_ids(files, (0.5, 0.5), ("fit", "evaluate"), seed=seed)


def probe_table(x: torch.Tensor, rows: pl.DataFrame, codes: Mapping[tuple[str, int], torch.Tensor],
                ks: Sequence[int], *, n_boot: int, seed: int, min_positives: int = 10) -> tuple[pl.DataFrame, dict]:
    """Every probe's scores (one row per label × probe × k × evaluated phase) and the split it used.

    Args:
        x: ``[n, d]`` activations of ``rows``; rows: harvest rows with ``kind``, ``file``, ``phase``, ``label_*``.
        codes: ``{(mix, seed): f [n, d_sae]}`` SAE feature activations of the rows.
        ks: the k of the sparse probes.
    Returns:
        ``(table, info)``: table columns ``label, probe, seed, k, eval_phase, auroc, auroc_lo, auroc_hi,
        accuracy, accuracy_lo, accuracy_hi, n_rows, n_pos, n_files, n_train, features``; info: the file split,
        and the labels left out with why.
    """
    split = split_files(rows, seed)
    info: dict[str, Any] = {"split_by": "source file", "fit_files": split["fit"], "evaluate_files": split["evaluate"],
                            "skipped": {}, "ks": list(ks)}
    out: list[dict] = []
    if not split["evaluate"]:
        info["skipped"]["all"] = "fewer than two code source files"
        return pl.DataFrame(out), info
    file = rows["file"].to_numpy()
    code = (rows["kind"] == "code").to_numpy()
    fit_m = code & np.isin(file, split["fit"]) & (rows["phase"] == "prefill").to_numpy()
    ev_m = {ph: code & np.isin(file, split["evaluate"]) & (rows["phase"] == ph).to_numpy() for ph in ("prefill", "decode")}
    xn = x.double().numpy()
    for label in LABELS:
        col = rows[f"label_{label}"]
        known = col.is_not_null().to_numpy()
        yv = col.fill_null(False).to_numpy().astype(bool)
        tr = np.flatnonzero(fit_m & known)
        n_pos = int(yv[tr].sum())
        if n_pos < min_positives or tr.size - n_pos < min_positives:
            info["skipped"][label] = f"{n_pos} positive of {tr.size} fit prefill rows (fewer than {min_positives})"
            continue
        tr = tr[SP.balanced_rows(yv[tr], seed)]
        ytr = yv[tr]

        def score(name: str, s: int, k: int, probe: Any, cols: np.ndarray | None, feats: np.ndarray, scale=None):
            for ph, em in ev_m.items():
                ev = np.flatnonzero(em & known)
                if ev.size == 0:
                    continue
                X = feats[ev] if cols is None else feats[ev][:, cols]
                X = scale.transform(X) if scale is not None else X
                sc = probe.decision_function(X)
                au = SP.auroc(sc, yv[ev], file[ev], n_boot=n_boot, seed=seed)
                ac = SP.balanced_accuracy(sc > 0, yv[ev], file[ev], n_boot=n_boot, seed=seed)
                out.append({"label": label, "probe": name, "seed": s, "k": k, "eval_phase": ph,
                            "auroc": au["value"], "auroc_lo": au["lo"], "auroc_hi": au["hi"],
                            "accuracy": ac["value"], "accuracy_lo": ac["lo"], "accuracy_hi": ac["hi"],
                            "n_rows": int(ev.size), "n_pos": au["n_pos"], "n_files": au["n_files"],
                            "n_train": int(tr.size), "features": [] if cols is None else [int(c) for c in cols]})

        from sklearn.preprocessing import StandardScaler

        scale = StandardScaler().fit(xn[tr])
        score("residual", -1, int(xn.shape[1]), SP.fit_probe(scale.transform(xn[tr]), ytr, seed), None, xn, scale)
        for (mix, s), f in codes.items():
            fn = f.float().numpy()
            for k in ks:
                cols = SP.top_k_mean_diff(fn[tr], ytr, k)
                score(mix, s, int(k), SP.fit_probe(fn[tr][:, cols], ytr, seed), cols, fn)
    return pl.DataFrame(out, infer_schema_length=None), info
