# What each job asks a cluster for (profiles/slurm); a local run only counts threads.

import math


def model_parameters(m):
    """MiniMind's parameter count from its dims (embedding tied to lm_head). Checked by hand against the
    model's own count: 4,458,752 at the defaults, 25,829,888 for MiniMind2-small, 131,392 for the tests'.
    """
    h, heads, kv_heads = (
        m["hidden_size"],
        m["num_attention_heads"],
        m["num_key_value_heads"],
    )
    kv = h // heads * kv_heads
    v3 = m["arch"] == "minimind3"  # a wider MLP, and a q and a k norm of head_dim
    inter = 64 * math.ceil(h * math.pi / 64) if v3 else 64 * -(-int(h * 8 / 3) // 64)
    layer = (
        2 * h * h + 2 * h * kv + 3 * h * inter + 2 * h + v3 * 2 * (h // heads)
    )  # q, o; k, v; the MLP; two norms; q_norm, k_norm
    return m["vocab_size"] * h + m["num_hidden_layers"] * layer + h


def training_mem_mb(cfg):
    """Peak memory of one training rank, in MB, with room to spare (measured: 625 MB at the defaults).

    400 MB for Python and torch, 28 bytes per parameter (fp32 weights, gradients, AdamW's two moments,
    and the resume file's copy while it is saved), and per token of the batch 4-byte activations:
    about 40 per hidden unit per layer, and 4 per vocabulary entry (logits, softmax, their gradients).
    """
    m = cfg["model"]
    tokens = cfg["batch_size"] * cfg["seq_len"]
    activations = (
        4
        * tokens
        * (40 * m["hidden_size"] * m["num_hidden_layers"] + 4 * m["vocab_size"])
    )
    total = 400 + (28 * model_parameters(m) + activations) / 2**20
    return int(-(-total // 100) * 100)


def training_runtime_min(cfg):
    """Wall time limit in minutes: the step's 6 * parameters * tokens FLOPs at a pessimistic 2 GFLOP/s
    per thread, twice over, plus 10 minutes for starting, evaluating and saving."""
    flops = (
        6
        * model_parameters(cfg["model"])
        * cfg["batch_size"]
        * cfg["seq_len"]
        * cfg["steps"]
    )
    return 10 + int(2 * flops / (2e9 * cfg["threads"]) / 60)


def training_resources(world_size):
    return {
        "cpus_per_task": lambda wildcards, threads: threads,
        "mem_mb": training_mem_mb(config) * world_size,
        "runtime": training_runtime_min(config),
    }


TRAINING_RESOURCES = training_resources(config["parallel"]["world_size"])
# evaluation, export, plots and text: one thread, the model once, a few minutes at most
ANALYSIS_RESOURCES = {
    "cpus_per_task": 1,
    "mem_mb": training_mem_mb(config),
    "runtime": 10,
}
