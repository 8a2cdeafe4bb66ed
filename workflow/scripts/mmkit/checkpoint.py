"""Checkpoint I/O: what a resume file holds, how checkpoints are saved (via mmkit.atomic) and read back.

Two kinds of file, kept apart as in MiniMind's lm_checkpoint:
  weights file  - the model's state_dict only (what inference needs; may be saved in half precision)
  resume file   - everything the next step depends on, in fp32 (see resume_state)
"""

import pickle
import re
import sys
import warnings
from pathlib import Path

import torch

from .atomic import write_atomic
from .errors import UserError

FORMAT_VERSION = 1
RESUME_KEYS = ("model", "optimizer", "step", "gen_state", "fingerprint")


# --- committing files (mmkit.atomic does the committing) ---------------------------------------


def save_atomic(obj, path) -> None:
    write_atomic(path, lambda f: torch.save(obj, f))


# --- reading files back -----------------------------------------------------------------------


def load_file(path, what: str = "checkpoint"):
    """torch.load with weights_only=True, every failure turned into one line that names the file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} {path} does not exist")
    if path.stat().st_size == 0:
        raise UserError(f"{what} {path} is empty")
    try:
        with warnings.catch_warnings():  # torch's own warnings about odd pickles would bury our one line
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        if found:
            raise UserError(
                f"{what} {path} holds Python objects other than tensors and plain data ({found.group(1)}); "
                "refusing to unpickle it (that could run code)"
            ) from None
        reason = re.search(r"WeightsUnpickler error: ([^\n]+)", str(e))
        raise UserError(f"{what} {path} is not a torch checkpoint ({reason.group(1) if reason else _first_line(e)})") from None
    except Exception as e:  # zip, EOF, storage errors: a truncated or foreign file
        raise UserError(f"{what} {path} is truncated or not a torch checkpoint ({_first_line(e)})") from None


def _first_line(e: Exception) -> str:
    """The first sentence of an exception's message: torch's go on for a paragraph."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text.split(". ")[0].rstrip(".")


def load_weights(path, model: torch.nn.Module, what: str = "weights file") -> dict:
    """A state_dict from PATH, checked key by key and shape by shape against MODEL."""
    sd = load_file(path, what)
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise UserError(f"{what} {path} is not a state_dict (a mapping of names to tensors)")
    check_fits(sd, model, f"{what} {path}")
    return sd


def check_fits(sd: dict, model: torch.nn.Module, source: str) -> None:
    expected = model.state_dict()
    missing = [k for k in expected if k not in sd]
    extra = [k for k in sd if k not in expected]
    if missing or extra:
        raise UserError(f"{source} does not fit the model: missing {missing[:3]}, unexpected {extra[:3]}")
    for k, t in expected.items():
        if sd[k].shape != t.shape:
            raise UserError(
                f"{source} does not fit the model: {k} has shape {list(sd[k].shape)}, "
                f"the model (config 'model') wants {list(t.shape)}"
            )


def load_model(path, model: torch.nn.Module) -> torch.nn.Module:
    """Load weights of any float dtype into MODEL; load_state_dict copies fp16/bf16 up into its fp32."""
    model.load_state_dict(load_weights(path, model))
    return model


# --- the resume file --------------------------------------------------------------------------


def resume_state(model, optimizer, step: int, generator: torch.Generator, fingerprint: dict) -> dict:
    """Everything step+1 depends on. Leave one out and the resumed run silently differs."""
    return {
        "model": model.state_dict(),  # fp32 weights: half precision here would change the next step
        "optimizer": optimizer.state_dict(),  # AdamW's exp_avg and exp_avg_sq per parameter, and its step
        "step": step,  # the LR schedule continues from here, counted on the total steps
        "gen_state": generator.get_state(),  # the data position: which batch comes next
        "fingerprint": fingerprint,  # what must match for the continuation to be bit-exact
    }


def load_resume(path) -> dict:
    """A resume file's dict, with every key resume_state writes, each of the right type."""
    state = load_file(path, "resume file")
    if not isinstance(state, dict):
        raise UserError(f"resume file {path} holds a {type(state).__name__}, not a resume dict")
    missing = [k for k in RESUME_KEYS if k not in state]
    if missing:
        raise UserError(f"resume file {path} lacks {', '.join(repr(k) for k in missing)}")
    if not (isinstance(state["step"], int) and isinstance(state["gen_state"], torch.Tensor)
            and isinstance(state["model"], dict) and isinstance(state["optimizer"], dict)
            and isinstance(state["fingerprint"], dict)):
        raise UserError(f"resume file {path} has entries of the wrong type")
    return state


def read_resume(path, fingerprint: dict, allow_mismatch: bool = False) -> dict:
    """Load and check a resume file; refuse one made under other settings unless allow_mismatch."""
    state = load_resume(path)
    saved = state["fingerprint"]
    if saved.get("format") != FORMAT_VERSION:
        raise UserError(f"resume file {path} has format {saved.get('format')}, this code reads {FORMAT_VERSION}")
    diffs = fingerprint_diff(saved, fingerprint)
    if diffs and not allow_mismatch:
        raise UserError(
            f"resume file {path} was made under other settings: {'; '.join(diffs)} "
            "(rerun with the same settings, or pass --allow-mismatch and lose bit-exactness)"
        )
    if diffs:
        print(f"warning: resuming despite {'; '.join(diffs)}: the result will not be bit-exact", file=sys.stderr)
    return state


def fingerprint_diff(saved: dict, current: dict, prefix: str = "") -> list[str]:
    diffs = []
    for k in sorted(set(saved) | set(current)):
        a, b = saved.get(k), current.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += fingerprint_diff(a, b, f"{prefix}{k}.")
        elif a != b:
            diffs.append(f"{prefix}{k} {a} in the file, {b} now")
    return diffs


# --- half precision and comparison ------------------------------------------------------------


def cast_state_dict(sd: dict, dtype: torch.dtype) -> dict:
    """Cast every tensor, keeping tensors that shared storage (the tied embedding) shared.

    Casting entry by entry would give lm_head.weight its own copy and store the embedding twice.
    """
    cast, out = {}, {}
    for k, t in sd.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        if key not in cast:
            cast[key] = t.to(dtype)
        out[k] = cast[key]
    return out


def compare_state_dicts(a: dict, b: dict) -> dict:
    """Max |a - b| per tensor name; None where a name is missing on one side or shapes differ."""
    diffs = {}
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b or a[k].shape != b[k].shape:
            diffs[k] = None
        elif a[k].numel() == 0:
            diffs[k] = 0.0
        else:
            diffs[k] = (a[k].double() - b[k].double()).abs().max().item()
    return diffs
