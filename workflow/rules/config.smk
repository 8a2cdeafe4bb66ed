# The config room: the config checked once, where the data comes from, and what each rule's jobs read.

import os
from pathlib import Path

from snakemake.exceptions import WorkflowError

# relative to the working directory, so job commands and file lists stay short
SCRIPTS = Path(os.path.relpath(Path(workflow.basedir) / "workflow" / "scripts"))
import yaml
from mmkit.config import check_config, leaf_keys, read_yaml, select
from mmkit.errors import UserError

# against workflow/schemas/config.schema.yaml and the rules a schema cannot say; one line naming the key.
# Each config file read again on its own first: Snakemake's YAML takes a key written twice silently.
try:
    for path in workflow.configfiles:
        read_yaml(path)
    check_config(config)
except UserError as e:
    raise WorkflowError(str(e)) from None

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
    "audit": [
        "seed",
        "threads",
        "model.vocab_size",
    ],  # the audit's sizes are its own (trainer_audit/audit.py)
}
# entries of READS whose parallel section is laid over the config's: dist.smk adds its rank layouts
LAYOUTS = {}
if config["parallel"]["world_size"] > 1 and config["parallel"]["strategy"] == "fsdp2":
    raise WorkflowError(
        "config key 'parallel.strategy': fsdp2 writes a resume directory, which the main experiment's"
        " analysis does not read; use ddp here, and see the fsdp2 runs in dist/ (snakemake dist)"
    )


def settings(name):
    """The settings file of READS[name]: rewritten only when one of its keys changes."""
    return f"{OUT}/settings/{name}.yaml"


def settings_values(name):
    """The keys READS[name] declares, with its rank layout's parallel section laid over the config's."""
    values = select(config, READS[name])
    if name in LAYOUTS:
        values["parallel"] = {**values["parallel"], **LAYOUTS[name]}
    return values


def checkpoint_dir(wildcards, output):
    """A training job's own folder of periodic checkpoints, named after its first output. Not an output:
    Snakemake deletes a failed job's outputs, and the folder must survive exactly then.
    """
    return f"{OUT}/checkpoints/{Path(output[0]).relative_to(OUT).with_suffix('')}"


# keys that name files: Snakemake already reruns a job whose input files change
PATH_KEYS = ["outdir", "data.train_tokens", "data.val_tokens"]


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
