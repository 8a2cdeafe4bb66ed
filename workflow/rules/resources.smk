# What each job asks a cluster for (profiles/slurm); a local run only counts threads.

from mmkit.config import parameter_count  # without torch: the DAG is parsed without it


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
    total = 400 + (28 * parameter_count(m) + activations) / 2**20
    return int(-(-total // 100) * 100)


def training_runtime_min(cfg):
    """Wall time limit in minutes: the step's 6 * parameters * tokens FLOPs at a pessimistic 2 GFLOP/s
    per thread, twice over, plus 10 minutes for starting, evaluating and saving."""
    flops = (
        6
        * parameter_count(cfg["model"])
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


# evaluation, export, plots and text: one thread, the model once, a few minutes at most
ANALYSIS_RESOURCES = {
    "cpus_per_task": 1,
    "mem_mb": training_mem_mb(config),
    "runtime": 10,
}
