"""A tiny Llama model written as a GGUF file, llama.cpp-style, for tests of GGUF loading and chat templates.

:func:`write_tiny_gguf` takes a Hugging Face Llama directory (e.g. :func:`tiny.build_tiny_model`) and
writes its float32 weights under llama.cpp's tensor names, with q/k rows permuted the way llama.cpp's
converter permutes them (transformers undoes it on load), the byte-level BPE tokenizer as GGUF
metadata, and a ChatML chat template like SmolLM2's. Loading it back must reproduce the logits.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIALS = ("<|im_start|>", "<|im_end|>")


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(model_dir: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    """Write the Llama model in ``model_dir`` as ``out`` (a GGUF file with a ChatML template)."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((model_dir / "config.json").read_text())
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    n_normal = len(tokens)
    tokens += list(SPECIALS)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    state = load_file(str(model_dir / "model.safetensors"))
    pad = len(tokens) - cfg["vocab_size"]

    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(float(cfg.get("rope_theta") or cfg.get("rope_parameters", {}).get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * n_normal + [gguf.TokenType.CONTROL] * len(SPECIALS))
    w.add_token_merges(merges)
    w.add_bos_token_id(n_normal)
    w.add_eos_token_id(n_normal + 1)
    w.add_chat_template(CHATML)

    def grow(t: np.ndarray) -> np.ndarray:  # rows for the two special tokens
        return np.concatenate([t, np.zeros((pad, t.shape[1]), t.dtype)]) if pad > 0 else t

    w.add_tensor("token_embd.weight", grow(state["model.embed_tokens.weight"]))
    w.add_tensor("output_norm.weight", state["model.norm.weight"])
    if "lm_head.weight" in state:
        w.add_tensor("output.weight", grow(state["lm_head.weight"]))
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(cfg["num_hidden_layers"]):
        for hf, gg in names.items():
            t = state[f"model.layers.{i}.{hf}.weight"]
            if gg == "attn_q":
                t = _permute(t, cfg["num_attention_heads"])
            elif gg == "attn_k":
                t = _permute(t, cfg["num_key_value_heads"])
            w.add_tensor(f"blk.{i}.{gg}.weight", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
