"""a. One training step of this project's model against transformers' LlamaForCausalLM, same weights.

A step is what mmkit.train.train does: set the LR, forward (under bf16 autocast for bf16), loss, backward,
clip_grad_norm_(1.0), AdamW, zero_grad, loss.item(). Ours uses config.yaml's AdamW kernel (`adamw`); the
reference uses torch's default AdamW, as a user of transformers would write it.
"""

import statistics

import torch
import torch.nn.functional as F
from common import BATCH, LR, SEQ, config_of, model_config, paired_ratio, summary, time_interleaved

from mmkit.model import MiniMindForCausalLM, ModelConfig
from mmkit.train import ADAMW_KERNELS, GRAD_CLIP, WEIGHT_DECAY, lr_at

PRECISIONS = ("fp32", "bf16")


def hf_twin(ours: MiniMindForCausalLM):
    """transformers' LlamaForCausalLM with our dims, holding our weights (tied embedding, no biases, sdpa)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = ours.config
    hf_cfg = LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta, tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
        hidden_act="silu", use_cache=False, attn_implementation="sdpa",
    )
    hf = LlamaForCausalLM(hf_cfg)
    hf.load_state_dict(ours.state_dict(), strict=True)
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr(), "HF lost the weight tie"
    assert hf.config._attn_implementation == "sdpa"
    return hf


def loss_of(model, x, y, is_hf: bool):
    """The same loss for both: ours computes it inside forward; HF's logits get the identical expression.

    HF is fed the input only (no labels=): its own loss would shift the labels a second time.
    """
    if not is_hf:
        return model(x, y)[1]
    logits = model(input_ids=x).logits
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))


def precision_ctx(precision: str):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


def train_step_fn(model, optimizer, x, y, precision: str, is_hf: bool):
    """One step as mmkit.train.train takes it; returns a function that takes the next one."""
    step = [0]

    def run():
        step[0] += 1
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step[0], 1000, LR)
        with precision_ctx(precision):
            loss = loss_of(model, x, y, is_hf)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return run


def matmul_params(c: ModelConfig) -> int:
    """N of the FLOP formula: non-embedding parameters + the lm_head matmul (tied, so = all parameters)."""
    attn = 2 * c.hidden_size * c.num_attention_heads * c.head_dim + 2 * c.hidden_size * c.num_key_value_heads * c.head_dim
    mlp = 3 * c.hidden_size * c.intermediate_size
    norms = 2 * c.hidden_size
    return c.num_hidden_layers * (attn + mlp + norms) + c.hidden_size + c.vocab_size * c.hidden_size


def step_flops(c: ModelConfig, batch: int = BATCH, seq: int = SEQ) -> float:
    """6 * N * tokens + 12 * L * seq * (heads * head_dim) * tokens (see the table footnote)."""
    tokens = batch * seq
    return 6 * matmul_params(c) * tokens + 12 * c.num_hidden_layers * seq * c.num_attention_heads * c.head_dim * tokens


def twins(dims: str):
    """Ours and HF's model with the same weights, their optimizers, and one fixed batch."""
    c = model_config(dims)
    torch.manual_seed(0)
    ours = MiniMindForCausalLM(c)
    hf = hf_twin(ours)
    assert sum(p.numel() for p in hf.parameters()) == ours.num_parameters() == matmul_params(c)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, c.vocab_size, (BATCH, SEQ), generator=gen)
    y = torch.randint(0, c.vocab_size, (BATCH, SEQ), generator=gen)
    kernel = ADAMW_KERNELS[config_of(dims)["adamw"]]
    opts = {"ours": torch.optim.AdamW(ours.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, **kernel),
            "hf": torch.optim.AdamW(hf.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)}
    ours.train()
    hf.train()
    return {"ours": ours, "hf": hf}, opts, x, y


def initial_loss_gap(models, x, y, precision: str) -> float:
    """|loss_ours - loss_HF| on the same batch before any step: shows the two hold the same weights."""
    with torch.no_grad(), precision_ctx(precision):
        return abs(loss_of(models["ours"], x, y, False).item() - loss_of(models["hf"], x, y, True).item())


def bench_train_steps(dims_list, threads_list, reps: int, warmup: int) -> list:
    rows = []
    for dims in dims_list:
        models, opts, x, y = twins(dims)
        gaps = {p: initial_loss_gap(models, x, y, p) for p in PRECISIONS}
        flops = step_flops(models["ours"].config)
        print(f"[step] {dims}: {models['ours'].num_parameters() / 1e6:.2f}M params, {flops / 1e9:.1f} GFLOP/step, "
              f"initial |loss gap| fp32 {gaps['fp32']:.2e} bf16 {gaps['bf16']:.2e}", flush=True)
        for threads in threads_list:
            torch.set_num_threads(threads)
            candidates = {f"{impl}-{p}": train_step_fn(models[impl], opts[impl], x, y, p, impl == "hf")
                          for p in PRECISIONS for impl in ("ours", "hf")}
            times = time_interleaved(candidates, reps, warmup, label=f"{dims} {threads}t" if reps > 1 else "")
            for name, t in times.items():
                impl, precision = name.split("-")
                hf_same, hf_fp32 = times[f"hf-{precision}"], times["hf-fp32"]
                row = {"section": "step", "what": impl, "dims": dims, "precision": precision, "threads": threads,
                       **summary(t), "gflop": flops / 1e9,
                       "gflops": flops / 1e9 / statistics.median(t),
                       "vs_hf_same_precision": statistics.median(t) / statistics.median(hf_same),
                       "vs_hf_same_precision_paired": paired_ratio(t, hf_same),
                       "vs_hf_fp32": statistics.median(t) / statistics.median(hf_fp32),
                       "vs_hf_fp32_paired": paired_ratio(t, hf_fp32),
                       "initial_loss_gap": gaps[precision]}
                rows.append(row)
                print(f"[step] {dims:>15} {threads}t {precision} {impl:>4}: {row['median_ms']:8.1f} ms "
                      f"(iqr {row['iqr_pct']:.0f}%)  /HF same prec {row['vs_hf_same_precision']:.3f}  "
                      f"/HF fp32 {row['vs_hf_fp32']:.3f}  {row['gflops']:.1f} GFLOP/s", flush=True)
    return rows
