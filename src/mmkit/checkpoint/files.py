"""Checkpoint files: how they are saved (via mmkit.atomic) and read back, and how two are compared.

Two kinds of file, kept apart as in MiniMind's lm_checkpoint:
  weights file  - the model's state_dict only (what inference needs; may be saved in half precision)
  resume file   - everything the next step depends on, in fp32 (what it holds: entries; the manager saves
                  and reads it)
"""

import hashlib
import math
import pickle
import re
import warnings
from pathlib import Path

import torch

from ..atomic import write_atomic
from ..errors import UserError
from ..failpoint import failpoint

# --- committing files (mmkit.atomic does the committing) ---------------------------------------


def save_atomic(obj, path) -> None:
    def write(f):
        torch.save(obj, f)
        failpoint("save")  # the tests kill a save here: all bytes written, none committed

    write_atomic(path, write)


def host_snapshot(tree, pin: bool = False, reuse: list | None = None):
    """A copy of TREE (dicts, lists, tuples of tensors and plain values) that training can no longer change:
    each tensor's storage copied once to host memory (pinned, PIN, so a CUDA copy runs asynchronously), and
    tensors that shared a storage (tied embeddings) share the copy's, so torch.save writes the same bytes as
    it would of TREE itself.

    REUSE: the host storages of an earlier snapshot that nothing reads any more; each is filled again where
    the next storage has its size (a fresh 300 MB costs its page faults at every checkpoint). It is
    replaced by this snapshot's storages, in order."""
    storages, containers = {}, {}
    spare = list(reuse or ())

    def copy(x):
        if isinstance(x, torch.Tensor):
            s = x.untyped_storage()
            if s._cdata not in storages:  # torch.save tells storages apart by this same identity
                nbytes = s.nbytes()
                if spare and spare[0].nbytes() == nbytes:
                    host = torch.empty(0, dtype=torch.uint8).set_(spare.pop(0))
                else:
                    spare.clear()  # another layout: fresh storages from here on
                    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
                host.copy_(torch.empty(0, dtype=torch.uint8, device=s.device).set_(s), non_blocking=pin)
                storages[s._cdata] = host.untyped_storage()
            return torch.empty(0, dtype=x.dtype).set_(storages[s._cdata], x.storage_offset(), x.size(), x.stride())
        if isinstance(x, (dict, list, tuple)):
            if id(x) not in containers:  # one object saved twice stays one (pickle's memo)
                new = (type(x)((k, copy(v)) for k, v in x.items()) if isinstance(x, dict)
                       else type(x)(copy(v) for v in x))
                if getattr(x, "__dict__", None):  # a state_dict's _metadata, which torch.save keeps too
                    new.__dict__.update({k: copy(v) for k, v in vars(x).items()})
                containers[id(x)] = new
            return containers[id(x)]
        return x  # int, float, str, None: immutable

    snapshot = copy(tree)
    if pin and torch.cuda.is_available():
        torch.cuda.synchronize()  # the copies have landed before anyone reads them
    if reuse is not None:
        reuse[:] = list(storages.values())
    return snapshot


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
            h.update(raw_bytes(x).numpy())  # the buffer itself: no copy made holding the GIL
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
