"""Training SAEs on harvested activations: prefill-only or hybrid prefill + decode.

The question trajscope asks of an SAE is whether features fitted on prompt
(prefill) activations still hold during decode. To answer it fairly the two SAEs
compared must differ only in their data: :func:`train_sae` draws every batch of
``batch_size`` rows with ``round(decode_fraction · batch_size)`` rows from the
decode pool and the rest from the prefill pool (sampling with replacement,
seeded), for the same number of steps. ``decode_fraction = 0`` is a
prefill-only SAE.

Recipe (Gao et al. 2024, "Scaling and evaluating sparse autoencoders", for TopK;
SAELens' standard SAE for ReLU + L1):

- inputs are scaled by one constant ``s`` so that ``E‖s·x‖² = d_in``; after
  training ``s`` is folded into the weights (:meth:`SAE.fold_scale`), so the
  saved SAE reads raw activations (SAELens' ``expected_average_only_in`` folding);
- ``b_dec`` starts at the mean of the training pool; decoder rows are kept at
  unit norm after every step (their gradient's parallel part removed first);
- reconstruction loss: per-element MSE of the scaled inputs;
- ``standard``: plus ``l1_coefficient · mean_rows Σ_i f_i`` (rows of W_dec have norm 1);
  dead features (no activation over the last ``dead_after`` rows) are resampled
  every ``resample_every`` steps toward badly reconstructed inputs;
- ``topk``: plus the AuxK loss ``aux_coefficient · ‖e − ê‖² / ‖e‖²`` where
  ``e = x − x̂`` and ``ê`` is decoded from the top ``aux_k`` pre-activations of the
  dead features only — it gives dead features a gradient toward the residual error.

TopK batches run sparsely (:func:`step_losses`): the dense pre-activations are computed once
without a graph, and only the ``k`` active (and ``aux_k`` AuxK) entries carry gradients, with the
decoder as an ``embedding_bag`` over the active rows of ``W_dec``; losses and gradients equal the
dense computation's up to float rounding. Threads are the caller's (``torch.set_num_threads``).

Loss curves go to a CSV (one row per ``log_every`` steps).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import time
from collections.abc import Callable
from typing import Any

import polars as pl
import torch
import torch.nn.functional as F

from trajscope.errors import TrajscopeError
from trajscope.sae.model import SAE, SAEConfig, resid_hook_name


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Settings of one SAE training run (stored in the SAE's ``cfg.json`` metadata)."""

    architecture: str = "topk"
    d_sae: int = 1024
    k: int = 32
    l1_coefficient: float = 3e-3
    decode_fraction: float = 0.0
    n_tokens: int = 2_000_000
    batch_size: int = 1024
    lr: float = 1e-3
    warmup_steps: int = 100
    aux_k: int = 256
    aux_coefficient: float = 1 / 32
    dead_after: int = 200_000
    resample_every: int = 500
    log_every: int = 25
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @property
    def n_steps(self) -> int:
        return max(1, self.n_tokens // self.batch_size)


def _batch(prefill: torch.Tensor, decode: torch.Tensor | None, n_dec: int, batch: int, gen: torch.Generator) -> torch.Tensor:
    parts = []
    if batch - n_dec > 0:
        parts.append(prefill[torch.randint(prefill.shape[0], (batch - n_dec,), generator=gen)])
    if n_dec > 0:
        parts.append(decode[torch.randint(decode.shape[0], (n_dec,), generator=gen)])
    return torch.cat(parts)


@torch.no_grad()
def _unit_decoder(sae: SAE) -> None:
    sae.W_dec.div_(sae.W_dec.norm(dim=-1, keepdim=True).clamp_min(1e-8))


@torch.no_grad()
def _drop_parallel_grad(sae: SAE) -> None:
    if sae.W_dec.grad is not None:
        w = sae.W_dec
        sae.W_dec.grad -= (sae.W_dec.grad * w).sum(-1, keepdim=True) * w


@torch.no_grad()
def _resample(sae: SAE, dead: torch.Tensor, x: torch.Tensor, x_hat: torch.Tensor, gen: torch.Generator) -> int:
    """Point dead features at inputs the SAE reconstructs worst (Anthropic, "Towards Monosemanticity")."""
    idx = dead.nonzero()[:, 0]
    if idx.numel() == 0:
        return 0
    err = (x - x_hat).pow(2).sum(-1)
    pick = torch.multinomial(err / err.sum(), idx.numel(), replacement=True, generator=gen)
    direction = (x[pick] - sae.b_dec)
    direction = direction / direction.norm(dim=-1, keepdim=True).clamp_min(1e-8)
    alive_norm = sae.W_enc[:, ~dead].norm(dim=0).mean() if (~dead).any() else torch.tensor(1.0)
    sae.W_dec[idx] = direction
    sae.W_enc[:, idx] = direction.T * alive_norm * 0.2
    sae.b_enc[idx] = 0.0
    return int(idx.numel())


class _GatheredPreActs(torch.autograd.Function):
    """``h[b, idx[b, j]]`` of ``h = x_in W_enc + b_enc``, given those values, with a backward that touches only
    the gathered entries (cost ``B·k·d_in`` instead of the dense ``B·d_sae·d_in``)."""

    @staticmethod
    def forward(ctx, x_in, w_enc, b_enc, idx, values):
        ctx.save_for_backward(x_in, w_enc, idx)
        ctx.n_features = b_enc.shape[0]
        return values.clone()

    @staticmethod
    def backward(ctx, g):
        x_in, w_enc, idx = ctx.saved_tensors
        k = idx.shape[1]
        flat, g_flat = idx.reshape(-1), g.reshape(-1).contiguous()
        order = torch.argsort(flat)
        counts = torch.bincount(flat, minlength=ctx.n_features)
        offsets = torch.cumsum(counts, 0) - counts
        rows = torch.div(order, k, rounding_mode="floor")
        # dW_enc[:, i] = Σ over the (b, j) with idx[b, j] = i of g[b, j] · x_in[b]: one bag of rows per feature
        d_w = F.embedding_bag(rows, x_in, offsets, mode="sum", per_sample_weights=g_flat[order]).T
        d_b = torch.zeros(ctx.n_features, dtype=g.dtype).index_add_(0, flat, g_flat)
        d_x = F.embedding_bag(idx, w_enc.T.contiguous(), mode="sum", per_sample_weights=g.contiguous())
        return d_x, d_w, d_b, None, None


def _sparse_pre_acts(sae: SAE, x_in: torch.Tensor, h: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """The pre-activations ``h`` at ``idx [B, k]``, differentiable in ``x_in``, ``W_enc`` and ``b_enc``."""
    return _GatheredPreActs.apply(x_in, sae.W_enc, sae.b_enc, idx, h.gather(-1, idx))


def _sparse_decode(sae: SAE, idx: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
    """``Σ_j vals[b, j] · W_dec[idx[b, j]]`` without the dense ``[B, d_sae]`` code (no ``b_dec``)."""
    return F.embedding_bag(idx, sae.W_dec, mode="sum", per_sample_weights=vals)


def _sparse_ok(sae: SAE, cfg: TrainConfig) -> bool:
    """Whether the TopK sparse path applies: it assumes ``h = (x − b_dec) W_enc + b_enc`` as trained here."""
    c = sae.cfg
    return (cfg.architecture == "topk" and c.normalize_activations in ("none", "expected_average_only_in")
            and not c.rescale_acts_by_decoder_norm)


def step_losses(sae: SAE, x: torch.Tensor, cfg: TrainConfig, dead: torch.Tensor, *,
                sparse: bool | None = None) -> tuple[torch.Tensor, ...]:
    """One batch's losses (module docstring): ``(mse, aux, sparsity, x_hat, fired [d_sae] bool, l0)``.

    TopK SAEs take the sparse path by default (``sparse=None``): the dense pre-activations are computed
    once without a graph, the top ``k`` (and, for AuxK, the top ``aux_k`` dead) entries are re-entered
    through :class:`_GatheredPreActs`, and the decoder runs as an ``embedding_bag`` over the active rows of
    ``W_dec``. Losses and gradients equal the dense path's (``sparse=False``) up to float rounding; only the
    dense path serves ReLU SAEs.
    """
    sparse = _sparse_ok(sae, cfg) if sparse is None else (sparse and _sparse_ok(sae, cfg))
    zero = torch.zeros(())
    n_dead = int(dead.sum())
    use_aux = cfg.architecture == "topk" and n_dead > 0 and cfg.aux_k > 0
    kk = min(cfg.aux_k, n_dead)
    if sparse:
        x_in = x - sae.b_dec * float(sae.cfg.apply_b_dec_to_input)
        with torch.no_grad():
            h = torch.addmm(sae.b_enc, x_in, sae.W_enc)
            idx = torch.topk(h, int(sae.cfg.k), dim=-1, sorted=False).indices
        vals = _sparse_pre_acts(sae, x_in, h, idx).relu()
        x_hat = _sparse_decode(sae, idx, vals) + sae.b_dec
        aux = zero
        if use_aux:
            e = (x - x_hat).detach()
            with torch.no_grad():
                aux_idx = torch.topk(h.masked_fill(~dead, float("-inf")), kk, dim=-1).indices
            e_hat = _sparse_decode(sae, aux_idx, _sparse_pre_acts(sae, x_in, h, aux_idx).relu())
            aux = (e - e_hat).pow(2).sum(-1).mean() / e.pow(2).sum(-1).mean().clamp_min(1e-8)
        with torch.no_grad():
            active = vals > 0
            fired = torch.zeros(sae.cfg.d_sae, dtype=torch.bool)
            fired[idx[active]] = True
            l0 = active.sum(-1).float().mean()
        return (x - x_hat).pow(2).mean(), aux, zero, x_hat, fired, l0
    h = sae.pre_acts(x)
    f = sae.activate(h)
    x_hat = f @ sae.W_dec + sae.b_dec
    aux = zero
    if use_aux:
        e = (x - x_hat).detach()
        vals, idx = torch.topk(h.masked_fill(~dead, float("-inf")), kk, dim=-1)
        e_hat = torch.zeros_like(h).scatter_(-1, idx, vals.relu()) @ sae.W_dec
        aux = (e - e_hat).pow(2).sum(-1).mean() / e.pow(2).sum(-1).mean().clamp_min(1e-8)
    sparsity = zero if cfg.architecture == "topk" else f.sum(-1).mean()
    with torch.no_grad():
        fired, l0 = (f > 0).any(0), (f > 0).sum(-1).float().mean()
    return (x - x_hat).pow(2).mean(), aux, sparsity, x_hat, fired, l0


def train_sae(prefill: torch.Tensor, decode: torch.Tensor | None, cfg: TrainConfig, *, layer: int,
              metadata: dict | None = None, log_csv: str | os.PathLike | None = None,
              progress: bool = True, on_log: Callable[[int, SAE], None] | None = None) -> tuple[SAE, pl.DataFrame]:
    """Train an SAE on a prefill pool and (for hybrid) a decode pool.

    Args:
        prefill: ``[n_p, d_in]`` prefill activations.
        decode: ``[n_d, d_in]`` decode activations (needed when ``cfg.decode_fraction > 0``).
        cfg: a :class:`TrainConfig`; ``cfg.n_steps`` batches of ``cfg.batch_size`` rows.
        layer: the block whose output the activations are (names the hook).
        metadata: extra fields for ``cfg.json``'s metadata (model name, harvest info).
        log_csv: where to write the loss curve (step, tokens, loss, mse, fvu, l0, aux, dead, lr, seconds).
        progress: show a tqdm bar.
        on_log: called as ``on_log(step, sae)`` at every logged step (the SAE reads *scaled* inputs then:
            its decoder directions are final, its norms are not).

    Returns:
        The trained :class:`SAE` (reads raw activations) and the loss-curve frame.
    """
    from tqdm.auto import tqdm

    if not 0.0 <= cfg.decode_fraction <= 1.0:
        raise TrajscopeError(f"decode_fraction must be between 0 and 1, not {cfg.decode_fraction}.")
    n_dec = int(round(cfg.decode_fraction * cfg.batch_size))
    if n_dec > 0 and (decode is None or decode.shape[0] == 0):
        raise TrajscopeError("A hybrid SAE (decode_fraction > 0) needs decode activations; harvest with "
                             "max_new_tokens > 0.")
    if n_dec < cfg.batch_size and prefill.shape[0] == 0:
        raise TrajscopeError("There are no prefill activations to train on.")
    d_in = prefill.shape[-1]
    pools = [prefill] + ([decode] if n_dec > 0 else [])
    pool_x = torch.cat(pools).float()
    scale = float((d_in / pool_x.pow(2).sum(-1).mean()).sqrt())
    prefill, decode = prefill.float() * scale, (decode.float() * scale if n_dec > 0 else None)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    sae_cfg = SAEConfig(architecture=cfg.architecture, d_in=d_in, d_sae=cfg.d_sae,
                        k=cfg.k if cfg.architecture == "topk" else None, hook_name=resid_hook_name(layer),
                        metadata={**(metadata or {}), "layer": layer, "training": cfg.to_dict(),
                                  "input_scale_folded": scale})
    sae = SAE(sae_cfg, seed=cfg.seed)
    with torch.no_grad():
        mix = torch.cat([_batch(prefill, decode, n_dec, cfg.batch_size, gen) for _ in range(8)])
        sae.b_dec.copy_(mix.mean(0))
        _unit_decoder(sae)
        sae.W_enc.copy_(sae.W_dec.T)
    opt = torch.optim.Adam(sae.parameters(), lr=cfg.lr, betas=(0.9, 0.999))
    n_steps = cfg.n_steps
    since_fired = torch.zeros(cfg.d_sae, dtype=torch.long)
    log: list[dict] = []
    t0 = time.perf_counter()
    bar = tqdm(range(n_steps), desc=f"train {cfg.architecture} d_sae={cfg.d_sae} dec={cfg.decode_fraction:g}",
               unit="step", disable=not progress)
    for step in bar:
        lr = cfg.lr * min(1.0, (step + 1) / max(1, cfg.warmup_steps))
        if step > 0.8 * n_steps:  # linear decay over the last 20%
            lr *= max(0.0, (n_steps - step) / (0.2 * n_steps))
        for g in opt.param_groups:
            g["lr"] = lr
        x = _batch(prefill, decode, n_dec, cfg.batch_size, gen)
        dead = since_fired >= cfg.dead_after
        mse, aux, sparsity, x_hat, fired, l0 = step_losses(sae, x, cfg, dead)
        loss = mse + cfg.l1_coefficient * sparsity + cfg.aux_coefficient * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        _drop_parallel_grad(sae)
        opt.step()
        _unit_decoder(sae)
        with torch.no_grad():
            since_fired = torch.where(fired, torch.zeros_like(since_fired), since_fired + x.shape[0])
            resampled = 0
            if (cfg.architecture == "standard" and cfg.resample_every and step > 0
                    and step % cfg.resample_every == 0 and step < 0.8 * n_steps):
                resampled = _resample(sae, dead, x, x_hat.detach(), gen)
                since_fired[dead] = 0
        if step % cfg.log_every == 0 or step == n_steps - 1:
            with torch.no_grad():
                centred = (x - x.mean(0)).pow(2).sum()
                rec = {"step": step, "tokens": (step + 1) * cfg.batch_size, "loss": float(loss), "mse": float(mse),
                       "fvu": float((x - x_hat).pow(2).sum() / centred), "l0": float(l0),
                       "aux": float(aux), "sparsity": float(sparsity),
                       "dead": float((since_fired >= cfg.dead_after).float().mean()),
                       "resampled": resampled, "lr": lr, "seconds": time.perf_counter() - t0}
            log.append(rec)
            bar.set_postfix(fvu=f"{rec['fvu']:.3f}", l0=f"{rec['l0']:.0f}", dead=f"{rec['dead']:.2f}")
            if on_log is not None:
                on_log(step, sae)
            if not math.isfinite(rec["loss"]):
                raise TrajscopeError(f"Training diverged at step {step} (loss {rec['loss']}); lower the learning rate.")
    bar.close()
    sae.fold_scale(scale)
    sae.eval()
    for p in sae.parameters():
        p.requires_grad_(False)
    curve = pl.DataFrame(log)
    if log_csv is not None:
        with open(log_csv, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=list(log[0]))
            w.writeheader()
            w.writerows(log)
    return sae, curve
