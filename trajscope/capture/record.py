"""StepRecord: what one captured step leaves behind, typed.

The kernels (:func:`trajscope.capture.kernels.step_record`,
:func:`~trajscope.capture.kernels.decode_records`) return plain dicts, because
they run where only torch is guaranteed (the NDIF server);
capture wraps each one in a :class:`StepRecord` as soon as it is back, and the
table builders, attachments and streaming events read these fields only.
Shapes use ``q`` for the step's query rows (P at step 0, 1 after), ``L`` layers
and ``H`` heads.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One step's small tensors.

    Attributes:
        step: 0 for prefill, s ≥ 1 for decode.
        first_pos: position of the step's first query row.
        attn_first_pos: position of the first query row whose attention was computed (``first_pos``
            unless the prefill computed only a window of rows: then ``P − n``).
        lp_first_pos: position of the first query row whose next-token distribution was computed
            (``first_pos`` unless the prefill unembedded only a window of rows: then ``P − m``).
        ids: ``[q]`` token ids fed to the step (the queries).
        chosen_lp: logprobs of tokens under the distribution that predicted them: at step 0
            ``[m − 1]`` for the prompt tokens at ``lp_first_pos + 1 … P − 1``; after, ``[1]`` for the
            query token (predicted by the previous step).
        entropy: ``[m]`` next-token entropy at each computed row (nats).
        top_ids, top_lp: ``[m, top_k_tokens]`` next-token alternatives.
        attn: ``[L, H, n, 7]`` attention telemetry (kernels.ATTN_FIELDS) of the ``n`` computed rows.
        top_pos, top_w: ``[L, H, n, top_k_keys]`` top attended keys (−1 / 0 padding).
        act: ``[L, q, 7]`` residual statistics (ACT_FIELDS).
        resid: ``{layer: [q, d_model]}`` kept residuals; rows: ``{layer: [H, n, k]}`` kept attention rows.
        probe: ``[n_probed_layers]`` drift scores, or None when the step was not probed.
        sae: the SAE kernel's outputs (``feature``, ``value``, ``l0``, ``sq_err``, ``sq_norm``, ``cos``), or None.
    """

    step: int
    first_pos: int
    attn_first_pos: int
    lp_first_pos: int
    ids: torch.Tensor
    chosen_lp: torch.Tensor
    entropy: torch.Tensor
    top_ids: torch.Tensor
    top_lp: torch.Tensor
    attn: torch.Tensor
    top_pos: torch.Tensor
    top_w: torch.Tensor
    act: torch.Tensor
    resid: dict[int, torch.Tensor]
    rows: dict[int, torch.Tensor]
    probe: Any = None
    sae: Any = None

    @classmethod
    def from_kernel(cls, rec: dict | "StepRecord") -> "StepRecord":
        """Wrap the kernel's dict (a StepRecord passes through)."""
        return rec if isinstance(rec, StepRecord) else cls(**rec)

    @property
    def n_queries(self) -> int:
        return int(self.ids.shape[0])

    @property
    def last_pos(self) -> int:
        """Position of the step's last query row."""
        return self.first_pos + self.n_queries - 1
