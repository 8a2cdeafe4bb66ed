"""Checkpoint files: how they are saved (via mmkit.atomic) and read back, and how two are compared.

Two kinds of file, kept apart as in MiniMind's lm_checkpoint:
  weights file  - the model's state_dict only (what inference needs; may be saved in half precision)
  resume file   - everything the next step depends on, in fp32 (what it holds: mmkit.resume; mmkit.store
                  saves and reads it)
"""

import hashlib
import math
import pickle
import re
import warnings
from pathlib import Path

import torch

from .atomic import write_atomic
from .errors import UserError
from .failpoint import failpoint

# --- committing files (mmkit.atomic does the committing) ---------------------------------------


def save_atomic(obj, path) -> None:
    def write(f):
        torch.save(obj, f)
        failpoint("save")  # the tests kill a save here: all bytes written, none committed

    write_atomic(path, write)


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
        if not isinstance(sd[k], torch.Tensor):
            raise UserError(f"{source}: {k} is a {type(sd[k]).__name__}, not a tensor")
        if sd[k].shape != t.shape:
            raise UserError(
                f"{source} does not fit the model: {k} has shape {list(sd[k].shape)}, "
                f"the model (config 'model') wants {list(t.shape)}"
            )


def load_model(path, model: torch.nn.Module) -> torch.nn.Module:
    """Load weights of any float dtype into MODEL; load_state_dict copies fp16/bf16 up into its fp32."""
    model.load_state_dict(load_weights(path, model))
    return model


def digest(obj) -> str:
    """sha256 of any resume entry: tensors by dtype, shape and bytes, containers in a fixed order."""
    h = hashlib.sha256()

    def feed(x):
        if isinstance(x, torch.Tensor):
            h.update(f"T{x.dtype}{tuple(x.shape)}".encode())
            h.update(raw_bytes(x).numpy().tobytes())
        elif isinstance(x, dict):
            h.update(f"D{len(x)}".encode())
            for k in sorted(x, key=repr):
                feed(k)
                feed(x[k])
        elif isinstance(x, (list, tuple)):
            h.update(f"L{len(x)}".encode())
            for v in x:
                feed(v)
        else:
            h.update(f"{type(x).__name__}:{x!r};".encode())

    feed(obj)
    return h.hexdigest()


def count_nonfinite(t: torch.Tensor) -> int:
    return int((~torch.isfinite(t)).sum()) if t.is_floating_point() else 0


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
    """Max |a - b| per tensor name: 0.0 for identical bits; None where a name is missing on one side or
    the shapes differ; NaN where either side holds a NaN or Inf that the other does not hold bit for bit
    (a difference computed around it would be a number that means nothing)."""
    diffs = {}
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b or a[k].shape != b[k].shape:
            diffs[k] = None
        elif same_bits(a[k], b[k]):
            diffs[k] = 0.0
        elif count_nonfinite(a[k]) or count_nonfinite(b[k]):
            diffs[k] = math.nan
        else:
            diffs[k] = (a[k].double() - b[k].double()).abs().max().item()
    return diffs


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes: NaN payloads included, unlike torch.equal, which also ignores dtype."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(raw_bytes(a), raw_bytes(b))


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor's storage as flat uint8: what its bits are, whatever its dtype (0-dim included)."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
