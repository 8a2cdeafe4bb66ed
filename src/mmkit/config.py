"""The experiment's configuration: one schema, one loader, for the Snakefile and every script.

A job is handed only the keys its rule declares (workflow/rules/config.smk, READS), in a settings file
of its own. Reading any other key fails at once, so no job can depend on a setting whose change would
not rerun it; every key read is recorded and named in the job's log when it succeeds.
"""

from __future__ import annotations

import copy
import functools
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import jsonschema
import yaml

from .checkpoint.folder import CheckpointConfig
from .errors import AT_SUCCESS, UserError

if TYPE_CHECKING:  # imported where they are built: the Snakefile checks the config without importing torch
    from .model import ModelConfig
    from .parallel import ParallelConfig

# the workflow's schema (Snakemake keeps it in workflow/schemas/), read from the checkout this package is installed
# from (editable: src/ beside workflow/)
SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"


@dataclass(frozen=True)
class RunConfig:
    """What a training job reads: everything the model, the optimizer, the batches and the LR depend on."""
    seed: int
    batch_size: int
    seq_len: int
    lr: float
    steps: int
    accumulation_steps: int
    threads: int
    device: str
    precision: str  # fp32 | bf16 | fp16, or auto until run.py resolves it for this machine
    adamw: str
    nonfinite: str
    data_format: str  # data.format: windows | minimind
    workers: int  # data.workers: DataLoader processes (minimind format); the bits do not depend on it
    model: ModelConfig
    parallel: ParallelConfig
    checkpoint: CheckpointConfig


class Settings:
    """Config values read as attributes (cfg.seq_len, cfg.model.vocab_size), only those the file holds."""

    def __init__(self, values: dict, source: str, prefix: str = "", read: set | None = None):
        self._values, self._source, self._prefix = values, source, prefix
        self._read = set() if read is None else read

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        key = self._prefix + name
        if name not in self._values:
            raise UserError(
                f"config key '{key}' is not in {self._source}: this job's rule does not declare it "
                "(add it to the rule's entry in READS, workflow/rules/config.smk)"
            )
        value = self._values[name]
        if isinstance(value, dict):
            return Settings(value, self._source, f"{key}.", self._read)
        self._read.add(key)
        return value

    def keys_read(self) -> list[str]:
        return sorted(self._read)


def parameter_count(model: dict) -> int:
    """MiniMind's parameter count from the config's model section, without building it (the DAG is parsed
    without torch, for what each job asks a cluster for): the embedding, tied to lm_head; per layer q and o,
    k and v, the MLP, two norms, and MiniMind-3's q and k norms of head_dim; the final norm. A test holds it
    to the built model's own count for both architectures."""
    h, heads, kv_heads = model["hidden_size"], model["num_attention_heads"], model["num_key_value_heads"]
    kv = h // heads * kv_heads
    v3 = model["arch"] == "minimind3"  # a wider MLP, and a q and a k norm of head_dim
    inter = 64 * math.ceil(h * math.pi / 64) if v3 else 64 * -(-int(h * 8 / 3) // 64)
    layer = 2 * h * h + 2 * h * kv + 3 * h * inter + 2 * h + v3 * 2 * (h // heads)
    return model["vocab_size"] * h + model["num_hidden_layers"] * layer + h


def leaf_keys(cfg: dict, prefix: str = "") -> list[str]:
    """Dotted names of every value in a nested config: model.vocab_size, data.corpus, seed, ..."""
    keys = []
    for k, v in cfg.items():
        keys += leaf_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else [prefix + k]
    return keys


def select(cfg: dict, keys) -> dict:
    """The part of CFG that KEYS name ('model' takes the whole section, 'model.vocab_size' one entry)."""
    out = {}
    for key in keys:
        *parents, last = key.split(".")
        src, dst = cfg, out
        for p in parents:
            src, dst = src[p], dst.setdefault(p, {})
        dst[last] = copy.deepcopy(src[last])
    return out


def _without_required(schema: dict) -> dict:
    schema = {k: v for k, v in schema.items() if k != "required"}
    if "properties" in schema:
        schema["properties"] = {k: _without_required(v) for k, v in schema["properties"].items()}
    return schema


class _UniqueKeys(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """YAML whose mappings refuse a key written twice (plain YAML keeps the last, silently)."""


def _mapping(loader, node, deep=False):
    lines = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        if key in lines:
            raise UserError(f"config file {node.start_mark.name}: key '{key}' is written twice (lines "
                            f"{lines[key]} and {line}); keep one")
        lines[key] = line
    return loader.construct_mapping(node, deep)


_UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def read_yaml(path) -> dict:
    """A config file's mapping: one line for a file that is missing, not YAML, not a mapping, or writes a key
    twice."""
    try:
        with open(path) as f:
            cfg = yaml.load(f, _UniqueKeys)
    except FileNotFoundError:
        raise UserError(f"config file {path} does not exist") from None
    except yaml.YAMLError as e:
        raise UserError(f"config file {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(cfg, dict):
        raise UserError(f"config file {path} does not hold a mapping of keys")
    return cfg


def _not_finite(cfg: dict, prefix: str = ""):
    for k, v in cfg.items():
        if isinstance(v, dict):
            yield from _not_finite(v, f"{prefix}{k}.")
        elif isinstance(v, float) and not math.isfinite(v):
            yield prefix + k, v


@functools.cache
def _schema() -> dict:
    return yaml.safe_load(SCHEMA.read_text())


def check_config(cfg: dict, partial: bool = False) -> None:
    """Raise UserError naming the key, its value and what is expected when cfg breaks the schema or a rule
    the schema cannot say.

    partial: cfg holds some of the keys (a job's settings file); each one present is checked.
    """
    for key, value in _not_finite(cfg):  # .nan passes any minimum (every comparison with it is false)
        raise UserError(f"config key '{key}': {value} is not a finite number")
    schema = copy.deepcopy(_schema())
    if partial:
        schema = _without_required(schema)
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(cfg), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        key = ".".join(str(p) for p in e.path) or "(top level)"
        expected = e.schema.get("description") if isinstance(e.schema, dict) else None
        raise UserError(f"config key '{key}': {e.message}" + (f"; expected: {expected}" if expected else ""))
    if "stop_at" in cfg and "steps" in cfg and not 1 <= cfg["stop_at"] <= cfg["steps"] - 1:
        raise UserError(f"config key 'stop_at': {cfg['stop_at']} must lie in 1..steps-1 (steps = {cfg['steps']})")
    par = cfg.get("parallel", {})
    if {"world_size", "batch_slices"} <= par.keys():
        slices = par["batch_slices"] or par["world_size"]
        if slices % par["world_size"]:
            raise UserError(f"config key 'parallel.batch_slices': {slices} slices cannot be shared evenly by "
                            f"parallel.world_size {par['world_size']} ranks")
        if "batch_size" in cfg and cfg["batch_size"] % slices:
            raise UserError(f"config key 'batch_size': {cfg['batch_size']} is not divisible into "
                            f"{slices} slices (parallel.batch_slices, or one per rank of parallel.world_size)")
    data = cfg.get("data", {})
    if data.get("format") == "minimind" and data.get("train_tokens"):
        raise UserError("config key 'data.format': minimind reads the corpus as JSONL documents; "
                        "data.train_tokens names a token stream (windows format): set it to null")
    if data.get("format") == "minimind" and par.get("world_size", 1) > 1:
        raise UserError("config key 'data.format': minimind runs on one rank here (an epoch's short last batch "
                        "cannot be cut into equal rank slices); use parallel.world_size 1")
    if par.get("backend") == "nccl" and cfg.get("device") == "cpu":
        raise UserError("config key 'parallel.backend': nccl needs device cuda (or auto on a machine with CUDA)")
    m = cfg.get("model", {})
    if {"hidden_size", "num_attention_heads", "num_key_value_heads"} <= m.keys():
        if m["hidden_size"] % m["num_attention_heads"]:
            raise UserError(
                f"config key 'model.num_attention_heads': {m['num_attention_heads']} does not divide "
                f"model.hidden_size {m['hidden_size']}"
            )
        if (m["hidden_size"] // m["num_attention_heads"]) % 2:
            raise UserError("config key 'model.num_attention_heads': head size hidden_size/heads must be even for RoPE")
        if m["num_attention_heads"] % m["num_key_value_heads"]:
            raise UserError(
                f"config key 'model.num_key_value_heads': {m['num_key_value_heads']} does not divide "
                f"model.num_attention_heads {m['num_attention_heads']}"
            )


def load_config(path) -> Settings:
    """A job's settings file (or a whole config.yaml), checked; keys read are logged when the job ends."""
    cfg = read_yaml(path)
    check_config(cfg, partial=True)
    settings = Settings(cfg, f"config file {path}")
    # one write: under torchrun every rank says it into the same log, and print's two writes interleave
    AT_SUCCESS.append(lambda: sys.stderr.write(f"config keys read from {path}: {' '.join(settings.keys_read())}\n"))
    return settings


def model_config(cfg: Settings) -> ModelConfig:
    """The architecture: every model.* key (a change to any one reruns whoever builds the model)."""
    from .model import ModelConfig

    return ModelConfig(**{k: getattr(cfg.model, k) for k in MODEL_KEYS})


def run_config(cfg: Settings) -> RunConfig:
    """Every training key, read now, so a job missing one fails before its first step."""
    from .parallel import ParallelConfig

    nested = ("model", "parallel", "checkpoint", "data_format", "workers")
    values = {k: getattr(cfg, k) for k in RunConfig.__dataclass_fields__ if k not in nested}
    model = model_config(cfg)
    parallel = ParallelConfig(**{k: getattr(cfg.parallel, k) for k in ParallelConfig.__dataclass_fields__})
    ck = cfg.checkpoint
    checkpoint = CheckpointConfig(every=ck.every, keep=ck.keep, keep_when_done=ck.keep_when_done,
                                  async_save=getattr(ck, "async"), overhead=ck.overhead)
    return RunConfig(**values, data_format=cfg.data.format, workers=cfg.data.workers, model=model,
                     parallel=parallel, checkpoint=checkpoint)


MODEL_KEYS = tuple(yaml.safe_load(SCHEMA.read_text())["properties"]["model"]["properties"])
