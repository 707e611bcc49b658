"""Architecture families: where each kind of Hugging Face causal LM keeps its parts.

A :class:`Family` names, as attribute paths from the top module, the list of
transformer blocks, each block's attention module, the final norm and the
unembedding, plus the config attribute names of depth, heads and context. The
functions :func:`hidden` and :func:`with_hidden` hide the one other family
difference that the rest of the model boundary meets: a block's output is a
tensor in some transformers versions and families, and a tuple whose first item
is the hidden state in others. Nothing outside :mod:`trajscope.model` needs to
know either.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trajscope.errors import TrajscopeError


@dataclasses.dataclass(frozen=True)
class Family:
    """Where one architecture family keeps its parts (attribute paths from the top module)."""

    name: str
    blocks: str  # ModuleList of transformer blocks
    attn: str  # attention module, relative to a block
    final_norm: str
    unembed: str
    n_layers: str  # config attribute names
    n_heads: str
    context: str

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


_LLAMA = Family("llama", "model.layers", "self_attn", "model.norm", "lm_head",
                "num_hidden_layers", "num_attention_heads", "max_position_embeddings")
FAMILIES: dict[str, Family] = {
    "gpt2": Family("gpt2", "transformer.h", "attn", "transformer.ln_f", "lm_head",
                   "n_layer", "n_head", "n_positions"),
    "gpt_neox": Family("gpt_neox", "gpt_neox.layers", "attention", "gpt_neox.final_layer_norm",
                       "lm_head", "num_hidden_layers", "num_attention_heads", "max_position_embeddings"),
    **{t: dataclasses.replace(_LLAMA, name=t) for t in
       ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "olmo", "olmo2")},
}


def family_for(config: Any) -> Family:
    """Pick the :class:`Family` for a Hugging Face config (by ``model_type``)."""
    model_type = getattr(config, "model_type", None)
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    known = ", ".join(sorted(FAMILIES))
    raise TrajscopeError(f"Unsupported architecture '{model_type}': trajscope knows the families {known}.")




def get_path(obj: Any, path: str) -> Any:
    """``obj.a.b.c`` for ``path = "a.b.c"``."""
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def hidden(out: Any) -> Any:
    """The hidden state ``[batch, q, d_model]`` of a block output (a tensor, or a tuple led by one)."""
    return out[0] if isinstance(out, tuple) else out


def with_hidden(out: Any, h: Any) -> Any:
    """``out`` with its hidden state replaced by ``h`` (same structure: tensor or tuple)."""
    return (h, *out[1:]) if isinstance(out, tuple) else h
