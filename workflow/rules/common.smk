import glob
import math
import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

# relative to the working directory, so job commands and file lists stay short
SCRIPTS = Path(os.path.relpath(Path(workflow.basedir) / "workflow" / "scripts"))
sys.path.insert(0, str(SCRIPTS))
import yaml
from mmkit.config import check_config, leaf_keys, select
from mmkit.errors import UserError

# check_config applies the same schema first, to stop with one line naming the key
try:
    check_config(config)
except UserError as e:
    raise WorkflowError(str(e)) from None
validate(config, "../schemas/config.schema.yaml")

ENV = "../../environment.yml"  # the project's one environment, for --software-deployment-method conda
OUT = config["outdir"]
# token files: the user's own when both are named, else built from the corpus by rule tokenize
TRAIN_TOKENS = config["data"]["train_tokens"] or f"{OUT}/data/train.npy"
VAL_TOKENS = config["data"]["val_tokens"] or f"{OUT}/data/val.npy"
if bool(config["data"]["train_tokens"]) != bool(config["data"]["val_tokens"]):
    raise WorkflowError(
        "config keys 'data.train_tokens' and 'data.val_tokens': name both or neither"
    )
# what a training job reads, by data.format: a token stream, or MiniMind's JSONL documents and tokenizer
WINDOWS = config["data"]["format"] == "windows"
TRAIN_DATA = (
    {"tokens": TRAIN_TOKENS}
    if WINDOWS
    else {"jsonl": f"{OUT}/data/train.jsonl", "tokenizer": f"{OUT}/data/tokenizer.json"}
)
TRAIN_DATA_ARGS = (
    "--tokens {input.tokens}"
    if WINDOWS
    else "--jsonl {input.jsonl} --tokenizer {input.tokenizer}"
)


def package(*modules):
    """The shared package's modules a job imports, declared as its inputs so that editing one reruns it."""
    if "config" in modules:  # config imports the dataclasses of these
        modules += ("parallel", "autoresume", "model")
    return [
        str(SCRIPTS / "mmkit" / f"{m}.py")
        for m in dict.fromkeys(("__init__", "errors", "atomic") + modules)
    ]


TRAINING_CODE = package(
    "config", "model", "data", "train", "checkpoint", "sharded", "failpoint", "hardware"
)

# What each rule's jobs read from the config. A job is handed only these keys, in its own settings file,
# and fails at once if it reads another one: so a changed setting reruns exactly the jobs that read it
# (and what follows from their outputs), and no job can come to depend on a setting silently.
TRAINING = [
    "seed",
    "batch_size",
    "seq_len",
    "lr",
    "steps",
    "accumulation_steps",
    "threads",
    "device",
    "precision",
    "adamw",
    "nonfinite",
    "model",
    "parallel",
    "checkpoint",
    "data.format",
    "data.workers",
]
READS = {
    "tokenize": [
        "data.corpus",
        "data.val_fraction",
        "data.tokenizer",
        "model.vocab_size",
    ],
    "straight": TRAINING,
    "resume": TRAINING + ["stop_at"],
    "resumed": TRAINING,  # with noopt, noskip, nosched, halfresume: the step comes from the resume file
    "fp16": ["model", "seq_len"],  # with bf16
    "inference": ["model"],
    "divergence": ["model", "seq_len"],
}
# dist/: the rank layouts it compares, each laid over the config's parallel section. batch_slices is 2 in
# the first three, so the global batch is summed in the same order whether 1 or 2 ranks train it;
# one_slice takes the whole batch at once, the resharding that cannot be bit-exact.
DIST_LAYOUTS = {
    "ddp": {"world_size": 2, "strategy": "ddp", "batch_slices": 2},
    "fsdp2": {"world_size": 2, "strategy": "fsdp2", "batch_slices": 2},
    "one_rank": {"world_size": 1, "strategy": "ddp", "batch_slices": 2},
    "one_slice": {"world_size": 1, "strategy": "ddp", "batch_slices": 1},
}
for layout in DIST_LAYOUTS:
    READS[f"dist_{layout}"] = TRAINING
    READS[f"dist_{layout}_stop"] = TRAINING + ["stop_at"]
if not WINDOWS and config["dist"]:
    raise WorkflowError(
        "config key 'dist': the dist/ runs train on several ranks, which data.format minimind does not"
        " (an epoch's short last batch cannot be cut into equal rank slices); set dist: false"
    )
if config["parallel"]["world_size"] > 1 and config["parallel"]["strategy"] == "fsdp2":
    raise WorkflowError(
        "config key 'parallel.strategy': fsdp2 writes a resume directory, which the main experiment's"
        " analysis does not read; use ddp here, and see the fsdp2 runs in dist/ (snakemake dist)"
    )


def settings_values(name):
    """The keys READS[name] declares, with a dist/ layout's parallel section laid over the config's."""
    values = select(config, READS[name])
    layout = name.removeprefix("dist_").removesuffix("_stop")
    if name.startswith("dist_"):
        values["parallel"] = {**values["parallel"], **DIST_LAYOUTS[layout]}
    return values


def checkpoint_dir(wildcards, output):
    """A training job's own folder of periodic checkpoints, named after its first output. Not an output:
    Snakemake deletes a failed job's outputs, and the folder must survive exactly then.
    """
    return f"{OUT}/checkpoints/{Path(output[0]).relative_to(OUT).with_suffix('')}"


# the dist/ runs (workflow/rules/dist.smk)
DIST = f"{OUT}/dist"
DIST_IN_ALL = config["dist"] or config["parallel"]["world_size"] > 1
# run: (layout, flags)
DIST_RUNS = {
    "ddp": ("ddp", ""),
    "rank0_gen": ("ddp", "--rank-generators"),
    "fsdp2": ("fsdp2", ""),
    "one_rank": ("one_rank", ""),
}
# continued on another number of ranks: (resume of, layout, flags)
RESHARDS = {
    "reshard_2to1": ("ddp", "one_rank", "--reshard"),
    "reshard_1to2": ("one_rank", "ddp", "--reshard"),
    "minimind_rescale": ("one_rank", "ddp", "--reshard --minimind-rescale"),
    "fsdp2_to1": ("fsdp2", "one_rank", "--reshard"),
    "reshard_2to1_one_slice": ("ddp", "one_slice", "--reshard"),
}
# each compared with the run it should equal: variant: reference
DIST_PAIRS = {
    "ddp/resumed": "ddp/straight",
    "rank0_gen/resumed": "rank0_gen/straight",
    "fsdp2/resumed": "fsdp2/straight",
    "fsdp2/straight": "ddp/straight",
    "reshard_2to1": "ddp/straight",
    "reshard_1to2": "ddp/straight",
    "minimind_rescale": "ddp/straight",
    "fsdp2_to1": "fsdp2/straight",
    "reshard_2to1_one_slice": "ddp/straight",
}


def dist_threads(layout):
    return config["threads"] * DIST_LAYOUTS[layout]["world_size"]


def dist_resume(run):
    return (
        f"{DIST}/{run}/resume.dcp"
        if DIST_RUNS[run][0] == "fsdp2"
        else f"{DIST}/{run}/resume.pth"
    )


# (a rule's shell string is evaluated when its job runs, after the loops below have moved on: what
# differs per rule goes into params, which are bound when the rule is defined)
DIST_SHELL = (
    "{params.launch} {input.script} --config {input.settings} --tokens {input.tokens} {params.flags}"
    " --out {output.weights} --loss-log {output.log} --timing {output.timing}"
    " --checkpoint-dir {params.checkpoints} 2> {log}"
)


def dist_file(run, suffix):
    return f"{DIST}/{run}{suffix}"


def launch(world_size):
    """How a training job starts: one plain process, or torchrun's ranks (never a home-made spawner)."""
    if world_size == 1:
        return "python"
    # OMP_NUM_THREADS silences torchrun's warning; each rank sets its own torch threads from the config
    return f"OMP_NUM_THREADS={config['threads']} torchrun --standalone --nproc-per-node {world_size}"


# keys that name files: Snakemake already reruns a job whose input files change
PATH_KEYS = ["outdir", "data.train_tokens", "data.val_tokens"]


def settings(name):
    """The settings file of READS[name]: rewritten only when one of its keys changes."""
    return f"{OUT}/settings/{name}.yaml"


def collapse_dist(rule_names):
    """The dist/ rules as one entry: a table row should not list fifteen of them."""
    dist = [n for n in rule_names if n.startswith("dist_")]
    rest = [n for n in rule_names if not n.startswith("dist_")]
    return rest + [f"dist_* ({len(dist)} rules)"] if dist else rest


def settings_table():
    """Markdown: each group of settings, and the rules whose jobs read them."""
    users = {}
    for r in workflow.rules:
        path = r.input.get("settings")
        if path:
            users.setdefault(Path(str(path)).stem, []).append(r.name)
    readers = {}
    for name in READS:
        for key in leaf_keys(settings_values(name)):
            readers.setdefault(key, []).extend(users.get(name, []))
    groups = {}
    for key, rules_reading in readers.items():
        groups.setdefault(tuple(collapse_dist(rules_reading)), []).append(key)
    rows = [
        f"| {' '.join(f'`{k}`' for k in keys)} | {', '.join(rules_reading)} |"
        for rules_reading, keys in groups.items()
    ]
    rows.append(
        f"| {' '.join(f'`{k}`' for k in PATH_KEYS)} | none: they name files, whose changes Snakemake sees |"
    )
    rows.append("| `dist` | none: it only chooses whether `all` builds dist/ |")
    no_settings = [r.name for r in workflow.rules if not r.input.get("settings")]
    no_settings = collapse_dist(
        [n for n in no_settings if n not in ("all", "settings", "settings_table")]
    )
    rows.append(f"| (no setting) | {', '.join(no_settings)}: they read only files |")
    header = [
        "| settings | rules whose jobs read them (each reruns, and what follows from it) |",
        "|---|---|",
    ]
    return "\n".join(header + rows) + "\n"


# --- what each job asks a cluster for (profiles/slurm); a local run only counts threads --------------


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
