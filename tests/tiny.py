"""Tiny models for tests: configs of each architecture family, built in a temp dir, and an independent
Hugging Face reference (eager attention) of the same weights. Imported by ``conftest.py`` and tests."""

from __future__ import annotations

import pathlib

import torch

import trajscope as ts
from trajscope.model import ModelHandle, sample_data_dir

SAMPLE_DIR = sample_data_dir() / "models" / "trajscope-tiny"
VOCAB = 4096


def tiny_config(family: str, **overrides):
    """A 2-layer config of ``family`` with a 4096-token vocabulary; keyword overrides win."""
    from transformers import GPT2Config, GPTNeoXConfig, LlamaConfig, MistralConfig, Qwen2Config

    common = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    if family == "gpt2":
        cfg = dict(n_embd=32, n_layer=2, n_head=4, n_positions=128, **common)
        return GPT2Config(**{**cfg, **overrides})
    if family == "gpt_neox":
        cfg = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   max_position_embeddings=128, **common)
        return GPTNeoXConfig(**{**cfg, **overrides})
    cls = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config}[family]
    cfg = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=128, **common)
    return cls(**{**cfg, **overrides})


def build_tiny_model(tmp: pathlib.Path, family: str, seed: int = 0, **overrides) -> pathlib.Path:
    """Save a random tiny model of ``family`` (plus the sample tokenizer) under ``tmp``; return its directory."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, **overrides))
    with torch.no_grad():  # larger weights make attention peaky and outputs non-trivial
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(3.0)
    path = tmp / family
    model.save_pretrained(path)
    PreTrainedTokenizerFast.from_pretrained(SAMPLE_DIR).save_pretrained(path)
    return path


FAMILIES = ("gpt2", "gpt_neox", "llama", "mistral", "qwen2")


_REFERENCES: dict[str, torch.nn.Module] = {}


def hf_reference(model: ModelHandle) -> torch.nn.Module:
    """An independent Hugging Face model of the same weights with eager attention (not trajscope's kernel)."""
    from transformers import AutoModelForCausalLM

    if model.source_path not in _REFERENCES:
        ref = AutoModelForCausalLM.from_pretrained(model.source_path, attn_implementation="eager", dtype=torch.float32)
        _REFERENCES[model.source_path] = ref.eval()
    return _REFERENCES[model.source_path]
