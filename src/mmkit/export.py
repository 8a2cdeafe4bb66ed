"""Weights for inference, in the layout transformers reads (LlamaForCausalLM, Qwen3ForCausalLM): no code
of ours needed.

A directory with
  model.safetensors - every tensor in half precision; the tied lm_head is not stored (safetensors
                      refuses shared tensors) and transformers reties it from tie_word_embeddings
  config.json       - the architecture as LlamaConfig (Qwen3Config) names it

safetensors is imported only here, when the directory is written: nothing else in the workflow needs it.
"""

import json
from pathlib import Path

import torch

from .atomic import write_atomic, write_text_atomic
from .checkpoint.files import cast_state_dict
from .errors import UserError
from .model import ModelConfig

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"
DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


# the transformers class that holds each architecture's weights unchanged: Qwen3 has MiniMind-3's per-head
# q/k norms (before RoPE, over head_dim) and no attention bias here
HF_CLASSES = {"minimind2": ("LlamaForCausalLM", "llama"), "minimind3": ("Qwen3ForCausalLM", "qwen3")}


def hf_config(cfg: ModelConfig, dtype: torch.dtype = torch.float16) -> dict:
    """config.json for transformers (LlamaForCausalLM, or Qwen3ForCausalLM for minimind3) describing the
    model mmkit.model builds from CFG."""
    architecture, model_type = HF_CLASSES[cfg.arch]
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        # transformers 5 reads rope_parameters; 4.x reads the top-level rope_theta (5 folds it in, same value)
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "rope_theta": cfg.rope_theta,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        # LlamaConfig would otherwise default them to 1 and 2; which ids end a text depends on the
        # tokenizer, which this directory does not hold, so say none rather than guess
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        # "dtype" is transformers 5's name, "torch_dtype" the one 4.x reads
        "dtype": DTYPE_NAMES[dtype],
        "torch_dtype": DTYPE_NAMES[dtype],
    }


def inference_tensors(sd: dict, dtype: torch.dtype = torch.float16) -> dict:
    """SD cast to DTYPE with lm_head.weight left out; refuse a state_dict whose head is not the embedding."""
    if HEAD in sd and not torch.equal(sd[HEAD], sd[EMBED]):
        raise UserError("lm_head.weight differs from model.embed_tokens.weight: the weights are not tied")
    return {k: t.contiguous() for k, t in cast_state_dict(sd, dtype).items() if k != HEAD}


def write_inference_dir(outdir, cfg: ModelConfig, sd: dict, dtype: torch.dtype = torch.float16) -> None:
    """Write OUTDIR/model.safetensors and OUTDIR/config.json, each atomically."""
    from safetensors.torch import save  # the export's own dependency

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    # metadata format=pt is what save_pretrained writes and what from_pretrained looks for
    blob = save(inference_tensors(sd, dtype), metadata={"format": "pt"})
    write_atomic(outdir / "model.safetensors", lambda f: f.write(blob))
    write_text_atomic(outdir / "config.json", json.dumps(hf_config(cfg, dtype), indent=2) + "\n")
