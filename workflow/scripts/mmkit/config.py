"""The experiment's configuration: one schema, checked the same way by the Snakefile and by run.py."""

from dataclasses import dataclass
from pathlib import Path

import jsonschema
import yaml

from .errors import UserError
from .model import ModelConfig

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "config.schema.yaml"


@dataclass(frozen=True)
class RunConfig:
    seed: int
    batch_size: int
    seq_len: int
    lr: float
    steps: int
    stop_at: int
    threads: int
    device: str
    precision: str
    model: ModelConfig


def check_config(cfg: dict) -> None:
    """Raise UserError naming the key when cfg breaks the schema or a rule the schema cannot say."""
    schema = yaml.safe_load(SCHEMA.read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(cfg), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        key = ".".join(str(p) for p in e.path) or "(top level)"
        raise UserError(f"config key '{key}': {e.message}")
    m = cfg["model"]
    if not 1 <= cfg["stop_at"] <= cfg["steps"] - 1:
        raise UserError(f"config key 'stop_at': {cfg['stop_at']} must lie in 1..steps-1 (steps = {cfg['steps']})")
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


def load_config(path) -> RunConfig:
    try:
        cfg = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"config file {path} does not exist") from None
    except yaml.YAMLError as e:
        raise UserError(f"config file {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(cfg, dict):
        raise UserError(f"config file {path} does not hold a mapping of keys")
    check_config(cfg)
    fields = RunConfig.__dataclass_fields__
    return RunConfig(
        **{k: cfg[k] for k in fields if k != "model"},
        model=ModelConfig(**cfg["model"]),
    )
