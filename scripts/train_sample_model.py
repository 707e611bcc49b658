"""Train trajscope's shipped sample model, ``trajscope-tiny``, from scratch on CPU.

The corpus is text that every CPython installation carries: the standard
library's ``.py`` sources (test packages excluded) and the English
documentation topics bundled in ``pydoc_data``. Files are split into train and
validation by a stable hash of their relative path, so the held-out split is the
same on every machine with the same Python version.

Steps:
1. train a byte-level BPE tokenizer (``tokenizers``) on the train files;
2. tokenize everything into one stream per split, documents separated by
   ``<|endoftext|>``;
3. train a small Llama (RoPE, RMSNorm, SwiGLU, tied embeddings) with AdamW and a
   cosine schedule, bf16 autocast on CPU, fixed seed;
4. save ``config.json``, ``model.safetensors``, tokenizer files, ``train_log.csv``
   and a model card (``README.md``) with corpus, steps, tokens seen, losses and
   three greedy samples.

Usage::

    python scripts/train_sample_model.py --out sample_data/models/trajscope-tiny --steps 1200
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import pathlib
import platform
import sys
import sysconfig
import time

import torch

EOS = "<|endoftext|>"
SAMPLE_PROMPTS = ("def fibonacci(n):\n    ", "import os\n\n\nclass ", '"""Return the')


def corpus_files() -> tuple[list[pathlib.Path], list[pathlib.Path], pathlib.Path]:
    """Return (train_files, validation_files, stdlib_root); 1 file in 20 is held out by path hash."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idle_test", "__pycache__"}
    files = sorted(
        f for f in root.rglob("*.py") if not skip.intersection(f.relative_to(root).parts)
    )
    train, val = [], []
    for f in files:
        h = int(hashlib.sha1(str(f.relative_to(root)).encode()).hexdigest(), 16)
        (val if h % 20 == 0 else train).append(f)
    return train, val, root


def pydoc_topics() -> tuple[list[str], list[str]]:
    """Return (train_texts, validation_texts) from ``pydoc_data.topics``, split by topic-name hash."""
    from pydoc_data.topics import topics

    train, val = [], []
    for name in sorted(topics):
        h = int(hashlib.sha1(name.encode()).hexdigest(), 16)
        (val if h % 20 == 0 else train).append(topics[name])
    return train, val


def read_texts(files: list[pathlib.Path]) -> list[str]:
    out = []
    for f in files:
        try:
            out.append(f.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return out


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS, pad_token=EOS
    )


def encode_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def batches(stream: torch.Tensor, batch: int, seq: int, gen: torch.Generator):
    while True:
        starts = torch.randint(0, len(stream) - seq - 1, (batch,), generator=gen)
        x = torch.stack([stream[s : s + seq + 1] for s in starts.tolist()])
        yield x[:, :-1], x[:, 1:]


@torch.no_grad()
def evaluate(model, stream: torch.Tensor, seq: int, n_windows: int = 64) -> float:
    """Mean next-token cross-entropy over evenly spaced validation windows."""
    model.eval()
    step = max(1, (len(stream) - seq - 1) // n_windows)
    losses = []
    for s in range(0, len(stream) - seq - 1, step)[:n_windows]:
        x = stream[s : s + seq + 1].unsqueeze(0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x[:, :-1]).logits
        losses.append(torch.nn.functional.cross_entropy(logits.float()[0], x[0, 1:]).item())
    model.train()
    return sum(losses) / len(losses)


def greedy_samples(model, tokenizer, n_new: int = 48) -> list[tuple[str, str]]:
    model.eval()
    out = []
    for p in SAMPLE_PROMPTS:
        ids = tokenizer(p, return_tensors="pt")
        gen = model.generate(**ids, max_new_tokens=n_new, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        out.append((p, tokenizer.decode(gen[0, ids["input_ids"].shape[1] :])))
    model.train()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="sample_data/models/trajscope-tiny")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=100)
    args = ap.parse_args(argv)

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    train_files, val_files, root = corpus_files()
    topics_train, topics_val = pydoc_topics()
    train_texts = read_texts(train_files) + topics_train
    val_texts = read_texts(val_files) + topics_val
    print(f"corpus: {len(train_files)} train files, {len(val_files)} validation files from {root}", flush=True)

    tokenizer = train_tokenizer(train_texts, args.vocab)
    tokenizer.save_pretrained(out)
    train_stream = encode_stream(tokenizer, train_texts)
    val_stream = encode_stream(tokenizer, val_texts)
    print(f"tokens: train {len(train_stream):,}  validation {len(val_stream):,}  ({time.time() - t0:.0f}s)", flush=True)

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.d_model,
        intermediate_size=int(args.d_model * 8 / 3) // 16 * 16,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95),
    )
    warmup = max(1, args.steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    gen = torch.Generator().manual_seed(args.seed)
    data = batches(train_stream, args.batch, args.seq, gen)
    log_rows = []
    model.train()
    t_train = time.time()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        x, y = next(data)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        row = {"step": step + 1, "train_loss": loss.item(), "lr": lr_at(step), "val_loss": ""}
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            row["val_loss"] = evaluate(model, val_stream, args.seq)
            el = time.time() - t_train
            print(f"step {step + 1}/{args.steps} train {loss.item():.3f} val {row['val_loss']:.3f} "
                  f"({el / (step + 1):.2f}s/step, {el / 60:.1f} min)", flush=True)
            model.save_pretrained(out)  # checkpoint: an interrupted run keeps its latest weights
        log_rows.append(row)

    model.save_pretrained(out)
    with open(out / "train_log.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(log_rows[0]))
        w.writeheader()
        w.writerows(log_rows)

    final_train = sum(r["train_loss"] for r in log_rows[-50:]) / min(50, len(log_rows))
    final_val = evaluate(model, val_stream, args.seq, n_windows=256)
    samples = greedy_samples(model, tokenizer)
    tokens_seen = args.steps * args.batch * args.seq
    minutes = (time.time() - t0) / 60
    info = {
        "corpus": f"CPython {platform.python_version()} standard library .py files (test packages excluded) + pydoc_data topics",
        "train_files": len(train_files), "validation_files": len(val_files),
        "train_tokens": len(train_stream), "validation_tokens": len(val_stream),
        "parameters": n_params, "steps": args.steps, "batch": args.batch, "seq": args.seq,
        "tokens_seen": tokens_seen, "train_loss_last50": round(final_train, 4),
        "validation_loss": round(final_val, 4), "seed": args.seed, "minutes": round(minutes, 1),
        "torch": torch.__version__, "python": sys.version.split()[0],
    }
    (out / "training.json").write_text(json.dumps(info, indent=2) + "\n")
    card = [
        "# trajscope-tiny", "",
        "A small Llama-architecture causal LM (RoPE, RMSNorm, SwiGLU, tied embeddings) that trajscope ships so",
        "the app and the tests work with no download. It writes Python-looking code; it is a test instrument,",
        "not a useful assistant.", "",
        "| | |", "|---|---|",
        f"| parameters | {n_params / 1e6:.2f}M ({args.layers} layers, d_model {args.d_model}, {args.heads} heads, vocab {len(tokenizer)}) |",
        f"| corpus | {info['corpus']} |",
        f"| split | {len(train_files)} train / {len(val_files)} validation files, 1 in 20 held out by SHA-1 of the relative path |",
        f"| corpus tokens | {len(train_stream):,} train, {len(val_stream):,} validation |",
        f"| training | {args.steps} steps × {args.batch} × {args.seq} tokens = {tokens_seen:,} tokens seen; AdamW lr {args.lr}, cosine, bf16 autocast on CPU, seed {args.seed} |",
        f"| loss | train {final_train:.3f} (mean of last 50 steps), validation {final_val:.3f} (nats/token) |",
        f"| wall time | {minutes:.0f} min on {torch.get_num_threads()} CPU threads |", "",
        "Reproduce: `python scripts/train_sample_model.py` (same seed, same Python version → same split).", "",
        "## Greedy samples", "",
    ]
    for p, s in samples:
        card += ["```python", p + s, "```", ""]
    (out / "README.md").write_text("\n".join(card))
    print(json.dumps(info, indent=2), flush=True)


if __name__ == "__main__":
    main()
