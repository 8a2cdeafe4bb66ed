import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

# relative to the working directory, so job commands and file lists stay short
SCRIPTS = Path(os.path.relpath(Path(workflow.basedir) / "workflow" / "scripts"))
sys.path.insert(0, str(SCRIPTS))
from mmkit.config import check_config
from mmkit.errors import UserError

# check_config applies the same schema first, to stop with one line naming the key
try:
    check_config(config)
except UserError as e:
    raise WorkflowError(str(e)) from None
validate(config, "../schemas/config.schema.yaml")

ENV = "../../environment.yml"  # the project's one environment, for --software-deployment-method conda
OUT = config["outdir"]
RESOLVED_CONFIG = f"{OUT}/config.resolved.yaml"
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
