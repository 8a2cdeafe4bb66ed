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


def package(*modules):
    """The shared package's modules a job imports, declared as its inputs so that editing one reruns it."""
    return [
        str(SCRIPTS / "mmkit" / f"{m}.py")
        for m in ("__init__", "errors", "atomic") + modules
    ]


TRAINING_CODE = package("config", "model", "data", "train", "checkpoint")

# What each rule's jobs read from the config. A job is handed only these keys, in its own settings file,
# and fails at once if it reads another one: so a changed setting reruns exactly the jobs that read it
# (and what follows from their outputs), and no job can come to depend on a setting silently.
TRAINING = [
    "seed",
    "batch_size",
    "seq_len",
    "lr",
    "steps",
    "threads",
    "device",
    "precision",
    "nonfinite",
    "model",
]
READS = {
    "tokenize": ["data.corpus", "data.val_fraction", "model.vocab_size"],
    "straight": TRAINING,
    "resume": TRAINING + ["stop_at"],
    "resumed": TRAINING,  # with noopt, noskip, nosched, halfresume: the step comes from the resume file
    "fp16": ["model", "seq_len"],  # with bf16
    "inference": ["model"],
    "divergence": ["model", "seq_len"],
}
# keys that name files: Snakemake already reruns a job whose input files change
PATH_KEYS = ["outdir", "data.train_tokens", "data.val_tokens"]


def settings(name):
    """The settings file of READS[name]: rewritten only when one of its keys changes."""
    return f"{OUT}/settings/{name}.yaml"


def settings_table():
    """Markdown: each group of settings, and the rules whose jobs read them."""
    users = {}
    for r in workflow.rules:
        path = r.input.get("settings")
        if path:
            users.setdefault(Path(str(path)).stem, []).append(r.name)
    readers = {}
    for name, keys in READS.items():
        for key in leaf_keys(select(config, keys)):
            readers.setdefault(key, []).extend(users[name])
    groups = {}
    for key, rules_reading in readers.items():
        groups.setdefault(tuple(rules_reading), []).append(key)
    rows = [
        f"| {' '.join(f'`{k}`' for k in keys)} | {', '.join(rules_reading)} |"
        for rules_reading, keys in groups.items()
    ]
    rows.append(
        f"| {' '.join(f'`{k}`' for k in PATH_KEYS)} | none: they name files, whose changes Snakemake sees |"
    )
    no_settings = [r.name for r in workflow.rules if not r.input.get("settings")]
    no_settings = [
        n for n in no_settings if n not in ("all", "settings", "settings_table")
    ]
    rows.append(f"| (no setting) | {', '.join(no_settings)}: they read only files |")
    header = [
        "| settings | rules whose jobs read them (each reruns, and what follows from it) |",
        "|---|---|",
    ]
    return "\n".join(header + rows) + "\n"
