"""What a run generated in the app costs on disk, before and after it is written.

A run directory holds its tables (Parquet) and its tensors (safetensors). The
tensors dominate long runs: the full attention rows of one layer are
``heads × n × n`` numbers for ``n`` computed positions (query × key, zero above
the diagonal), about 19 MB per layer in float16 for 1,000 tokens on a 9-head
model; residuals are ``n × d_model`` per layer. So the app, by default, keeps
full rows only of the layer on screen and writes them in float16
(:func:`compact_tensors`); keeping every layer's rows in float32 is a choice the
user makes in the sidebar. :func:`estimate_bytes` gives the size of a run before
Generate, from the model's shape and the settings; the ``attention`` table's
bytes per row were measured on SmolLM2-135M runs (Parquet, zstd). No Panel here.
"""

from __future__ import annotations

import dataclasses

import torch

# measured: Parquet bytes per row of the attention table (run_id, step, layer, head, 7 statistics and two
# top-8 lists), of the tokens table (per position, with top-5 alternatives), of the activations table
# (per position × layer); on a 64-token SmolLM2-135M run: 1,280,282 B / 21,870 rows, 10,197 B / 82 rows
ATTENTION_ROW_BYTES = 60
TOKEN_ROW_BYTES = 130
ACTIVATION_ROW_BYTES = 22


@dataclasses.dataclass(frozen=True)
class RunShape:
    """The model's shape that a run's size depends on (``ModelHandle`` attributes of the same names)."""

    n_layers: int
    n_heads: int
    d_model: int


def estimate_bytes(shape: RunShape, prompt_len: int, max_new_tokens: int, attention_layers: int,
                   residual_layers: int, float16: bool = True) -> int:
    """Bytes of a run directory the app writes, at most (a run that stops at EOS is smaller).

    Args:
        shape: the model's layers, query heads and width.
        prompt_len: prompt tokens P.
        max_new_tokens: decode steps N.
        attention_layers: layers whose full attention rows are kept.
        residual_layers: layers whose residuals are kept.
        float16: tensors written in float16 (else float32).
    Returns:
        The estimate in bytes: tables (every prompt row computed, as the app asks) plus tensors.
    """
    n = prompt_len + max_new_tokens - 1  # computed positions: the last token is produced, never read
    queries = prompt_len + max_new_tokens - 1
    tables = (queries * shape.n_layers * shape.n_heads * ATTENTION_ROW_BYTES + (n + 1) * TOKEN_ROW_BYTES
              + n * shape.n_layers * ACTIVATION_ROW_BYTES)
    rows = attention_layers * shape.n_heads * n * n * (2 if float16 else 4)
    residuals = residual_layers * n * shape.d_model * (2 if float16 else 4)
    return int(tables + rows + residuals)


def compact_tensors(tensors: dict[str, torch.Tensor], float16: bool = True) -> dict[str, torch.Tensor]:
    """The tensors as the app writes them: in float16 when ``float16``, else as they are.

    Attention probabilities lie in [0, 1], where float16 keeps an absolute error below 5e-4, enough
    for heatmaps and top keys; residuals keep a relative error below 1e-3 (an SAE or a profile reads
    them upcast; residual norms of small models stay far below float16's 65,504).
    """
    if not float16:
        return dict(tensors)
    return {k: v.half() if v.is_floating_point() else v for k, v in tensors.items()}


def human(n_bytes: float) -> str:
    """``"12.3 MB"`` (decimal units, as ``du --si`` and file managers show them)."""
    for unit in ("B", "kB", "MB", "GB"):
        if n_bytes < 1000 or unit == "GB":
            return f"{n_bytes:.0f} {unit}" if unit == "B" else f"{n_bytes:.1f} {unit}"
        n_bytes /= 1000
    return f"{n_bytes:.1f} GB"
