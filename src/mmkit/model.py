"""MiniMind's decoder, in the order data flows through it: MiniMind2 (LLaMA-compatible) or MiniMind-3.

MiniMind-3 (jingyaogong/minimind at d65ef2c, model/model_minimind.py) adds a per-head RMSNorm on queries
and keys before RoPE, widens the MLP to 64 * ceil(hidden * pi / 64) and uses eps 1e-6. state_dict keys
match MiniMind's and transformers' (LlamaForCausalLM for minimind2, Qwen3ForCausalLM for minimind3), so
weights move between them without renaming.
"""

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 6400
    max_position_embeddings: int = 32768
    rope_theta: float = 1e6
    arch: str = "minimind2"  # minimind2 | minimind3
    dropout: float = 0.0  # MiniMind's: after the embedding, in attention, after o_proj (training only)
    flash_attn: bool = True  # MiniMind's switch: SDPA's fused kernel, or softmax(QKᵀ/√d + mask)V written out

    @property
    def rms_norm_eps(self) -> float:
        return 1e-6 if self.arch == "minimind3" else 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def intermediate_size(self) -> int:
        # MiniMind2: 8/3 of hidden, MiniMind-3: pi times hidden; rounded up to a multiple of 64
        if self.arch == "minimind3":
            return 64 * math.ceil(self.hidden_size * math.pi / 64)
        return 64 * math.ceil(int(self.hidden_size * 8 / 3) / 64)

    def to_dict(self) -> dict:
        return {**asdict(self), "rms_norm_eps": self.rms_norm_eps}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # normalise in fp32 whatever the activation dtype, as MiniMind does
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.type_as(x)


def rope_cos_sin(head_dim: int, max_len: int, theta: float):
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    freqs = torch.outer(torch.arange(max_len).float(), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def dropout(x, p: float, training: bool):
    # p = 0 is skipped, not called: the default model stays the exact graph it always was
    return F.dropout(x, p) if p and training else x


def causal_attention(q, k, v, dropout_p: float):
    """MiniMind's attention without flash (flash_attn: false), as upstream writes it: scores, causal mask,
    softmax in fp32, dropout on the weights. On CPU at short sequences it beats SDPA's flash kernel in bf16."""
    t = q.size(-2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    scores = scores + torch.full((t, t), float("-inf"), device=scores.device).triu(1)
    return dropout(F.softmax(scores.float(), dim=-1).type_as(q), dropout_p, True) @ v


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.dropout = cfg.dropout
        self.flash_attn = cfg.flash_attn
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)
        if cfg.arch == "minimind3":  # per-head norms of queries and keys, before RoPE
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # grouped-query attention: each key/value head serves n_heads // n_kv query heads
        k = k.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        v = v.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        p = self.dropout if self.training else 0.0
        if self.flash_attn:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            y = causal_attention(q, k, v, p)
        return dropout(self.o_proj(y.transpose(1, 2).reshape(b, t, -1)), self.dropout, self.training)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.dropout = cfg.dropout
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        cos, sin = rope_cos_sin(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)
        # derived from the config, so not saved: checkpoints hold learned state only
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        x = dropout(self.embed_tokens(idx), self.dropout, self.training)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class MiniMindForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = Decoder(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight  # tied, as in MiniMind
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        logits = self.lm_head(self.model(idx))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())  # parameters() counts the tied tensor once
