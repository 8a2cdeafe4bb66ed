"""Checkpoint I/O: what a resume file holds, how checkpoints are saved (via mmkit.atomic) and read back.

Two kinds of file, kept apart as in MiniMind's lm_checkpoint:
  weights file  - the model's state_dict only (what inference needs; may be saved in half precision)
  resume file   - everything the next step depends on, in fp32 (see resume_state)
"""

import hashlib
import math
import pickle
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from .atomic import write_atomic
from .errors import UserError
from .failpoint import failpoint

FORMAT_VERSION = 4  # 2: skipped_steps, digests, the weights' dtype; 3: origin and loss_log;
# 4: data_position, rng_state, scaler


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


# --- the resume file --------------------------------------------------------------------------


def resume_state(model_state: dict, optimizer_state: dict, step: int, skipped_steps: int,
                 generator: torch.Generator, fingerprint: dict, origin: dict, loss_log: list, *,
                 data_position: dict, rng_state: dict, scaler: dict | None) -> dict:
    """Everything step+1 depends on. Leave one out and the resumed run silently differs.

    One file (save_resume_file) at world size 1 and under DDP; under FSDP2 model and optimizer are
    sharded and the whole goes to a DCP directory (mmkit.sharded).
    """
    return {
        "model": model_state,  # fp32 weights: half precision here would change the next step
        "optimizer": optimizer_state,  # AdamW's exp_avg and exp_avg_sq per parameter, and its step
        "step": step,  # the LR schedule continues from here, counted on the total steps
        "skipped_steps": skipped_steps,  # updates skipped for a non-finite loss: AdamW counted step - these
        # the data position: which batch comes next. One generator for all ranks, so one state
        # (the rank0_gen ablation saves rank 0's and so forgets the others')
        "gen_state": generator.get_state(),
        # the data position as a value: {epoch, batches of it read}. The minimind format's whole position
        # (its epoch order is re-drawn from seed + epoch); with windows, epoch 0 and the batches drawn
        "data_position": data_position,
        # the global RNG (dropout's masks): {"cpu": state, "cuda": state or None}
        "rng_state": rng_state,
        "scaler": scaler,  # fp16's GradScaler: its loss scale and growth tracker (None without fp16)
        "fingerprint": fingerprint,  # what must match for the continuation to be bit-exact
        # which run this is a checkpoint of: the resume file it started from (sha256) and the ablations
        # applied then. Two runs of one fingerprint can differ (resumed vs noopt): auto-resume checks it
        "origin": origin,
        "loss_log": loss_log,  # [(step, loss)] of the steps this run trained: a restart rewrites the same log
    }


def save_resume_file(state: dict, path) -> None:
    save_atomic(seal(state), path)


RESUME_KEYS = ("model", "optimizer", "step", "skipped_steps", "gen_state", "data_position", "rng_state", "scaler",
               "fingerprint", "origin", "loss_log", "digests")
SEALED = ("model", "optimizer", "step", "skipped_steps", "gen_state", "data_position", "rng_state", "scaler",
          "origin", "loss_log")


def global_rng_state() -> dict:
    return {"cpu": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None}


def set_global_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"])


def seal(state: dict) -> dict:
    """Add the sha256 of each entry: an edit or a flipped bit that no other check sees is still refused."""
    return {**state, "digests": {k: digest(state[k]) for k in SEALED}}


def digest(obj) -> str:
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


def load_resume(path) -> dict:
    """A resume file's dict, with every key resume_state writes, each of the right type."""
    state = load_file(path, "resume file")
    if not isinstance(state, dict):
        raise UserError(f"resume file {path} holds a {type(state).__name__}, not a resume dict")
    missing = [k for k in RESUME_KEYS if k not in state]
    if missing:
        raise UserError(f"resume file {path} lacks {', '.join(repr(k) for k in missing)}")
    types = {"model": dict, "optimizer": dict, "step": int, "skipped_steps": int, "gen_state": torch.Tensor,
             "data_position": dict, "rng_state": dict, "scaler": (dict, type(None)),
             "fingerprint": dict, "origin": dict, "loss_log": list, "digests": dict}
    for k, kind in types.items():
        if not isinstance(state[k], kind) or (kind is int and isinstance(state[k], bool)):
            names = " or ".join(t.__name__ for t in (kind if isinstance(kind, tuple) else (kind,)))
            raise UserError(f"resume file {path}: entry '{k}' is of type {type(state[k]).__name__}, not {names}")
    return state


def read_resume(path) -> dict:
    """Load a resume file, of this code's format (check_fingerprint then compares its settings)."""
    state = load_resume(path)
    check_format(state["fingerprint"], f"resume file {path}")
    return state


def check_format(saved_fingerprint: dict, source: str) -> None:
    if saved_fingerprint.get("format") != FORMAT_VERSION:
        raise UserError(f"{source} has format {saved_fingerprint.get('format')}, this code reads {FORMAT_VERSION}")


# what may differ when a run continues on another number of ranks (--reshard); anything else may not
RESHARD_KEYS = ("world_size", "strategy", "batch_slices")


def check_fingerprint(saved: dict, current: dict, source: str, allow_mismatch: bool = False, reshard: bool = False) -> None:
    """Refuse a resume made under other settings, unless allow_mismatch (or reshard, for the rank layout)."""
    diffs = fingerprint_diff(saved, current)
    layout = [d for d in diffs if d.split()[0] in RESHARD_KEYS]
    other = [d for d in diffs if d not in layout]
    if layout and not (reshard or allow_mismatch):
        raise UserError(f"{source} was saved with another rank layout: {'; '.join(layout)} "
                        "(pass --reshard to continue it on this one)")
    if other and not allow_mismatch:
        raise UserError(
            f"{source} was made under other settings: {'; '.join(other)} "
            "(rerun with the same settings, or pass --allow-mismatch and lose bit-exactness)"
        )
    if layout:
        exact = saved.get("batch_slices") == current.get("batch_slices")
        print(f"resume: resharding ({'; '.join(layout)}): "
              + ("the same batch slices, so the same sums: bit-exact" if exact else
                 "other batch slices, so gradients are summed in another order: not bit-exact"), file=sys.stderr)
    if other:
        print(f"warning: resuming despite {'; '.join(other)}: the result will not be bit-exact", file=sys.stderr)


def fingerprint_diff(saved: dict, current: dict, prefix: str = "") -> list[str]:
    diffs = []
    for k in sorted(set(saved) | set(current)):
        a, b = saved.get(k), current.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += fingerprint_diff(a, b, f"{prefix}{k}.")
        elif a != b:
            diffs.append(f"{prefix}{k} {a} in the file, {b} now")
    return diffs


def check_resume(state: dict, path, *, model, optimizer, expected_gen_state: Callable[[int], torch.Tensor],
                 expected_position: Callable[[int], dict], scaler, last_step: int, ignore: tuple = ()) -> None:
    """Every entry of a resume file checked against what this run built, before a single step runs.

    Each failure is one UserError naming the entry. Entries in IGNORE (an ablation's --no-optim,
    --no-skip) are not checked: the run throws them away.
    """
    def refuse(entry, what):
        raise UserError(f"resume file {path}: entry '{entry}' {what}")

    step, skipped = state["step"], state["skipped_steps"]
    if not 1 <= step < last_step:
        refuse("step", f"is {step}; this run can continue only from a step in 1..{last_step - 1}")
    if not 0 <= skipped <= step:
        refuse("skipped_steps", f"is {skipped}; it must lie in 0..step ({step})")

    if "model" not in ignore:
        check_weights(state, path, model, refuse)

    if "optimizer" not in ignore:
        check_optimizer_state(state["optimizer"], optimizer, step - skipped, refuse)
    if "gen_state" not in ignore:
        g = state["gen_state"]
        expected = expected_gen_state(step)
        if g.dtype != torch.uint8 or g.shape != expected.shape:
            refuse("gen_state", f"is a {g.dtype} tensor of shape {list(g.shape)}, "
                                f"the batch generator's state is uint8 of shape {list(expected.shape)}")
        if not torch.equal(g, expected):
            refuse("gen_state", f"is not the data position after {step} batches of this run")
    if "data_position" not in ignore and state["data_position"] != expected_position(step):
        refuse("data_position", f"is {state['data_position']}; after step {step} this run reads from "
                                f"{expected_position(step)}")
    if "rng_state" not in ignore:
        check_rng_state(state["rng_state"], refuse)
    if "scaler" not in ignore:
        check_scaler_state(state["scaler"], scaler, refuse)

    check_loss_log(state["loss_log"], step, refuse)

    for k in SEALED:
        if k not in ignore and digest(state[k]) != state["digests"].get(k):
            refuse(k, "does not match the sha256 recorded when the file was saved (edited or damaged)")


def check_rng_state(saved: dict, refuse) -> None:
    now = global_rng_state()
    if set(saved) != set(now):
        refuse("rng_state", f"has {sorted(saved)}, not {sorted(now)}")
    for device, t in saved.items():
        if now[device] is None and t is None:
            continue
        if not (isinstance(t, torch.Tensor) and now[device] is not None and t.dtype == torch.uint8
                and t.shape == now[device].shape):
            refuse("rng_state", f"'{device}' is not a {device} RNG state of this torch")


def check_scaler_state(saved, scaler, refuse) -> None:
    """None without fp16; with it, GradScaler's own keys, a finite positive scale."""
    if scaler is None:
        if saved is not None:
            refuse("scaler", "holds a GradScaler's state, but this run has no fp16 loss scaling")
        return
    built = scaler.state_dict()
    if not isinstance(saved, dict) or saved.keys() != built.keys():
        refuse("scaler", f"is not a GradScaler's state ({sorted(built)})")
    scale = saved["scale"]
    if not (isinstance(scale, float) and math.isfinite(scale) and scale > 0):
        refuse("scaler", f"has loss scale {scale!r}, not a finite positive number")
    differing = [k for k in ("growth_factor", "backoff_factor", "growth_interval") if saved[k] != built[k]]
    if differing:
        refuse("scaler", "has other settings: " + ", ".join(f"{k} {saved[k]} in the file, {built[k]} now"
                                                           for k in differing))


def check_loss_log(rows: list, step: int, refuse) -> None:
    """(step, loss) rows of consecutive steps ending at STEP (none: a file with no log of its own)."""
    for i, row in enumerate(rows):
        if not (isinstance(row, (tuple, list)) and len(row) == 2 and type(row[0]) is int
                and isinstance(row[1], float)):
            refuse("loss_log", f"row {i} is {row!r}, not (step, loss)")
        if row[0] != step - len(rows) + 1 + i:
            refuse("loss_log", f"row {i} is of step {row[0]}; the rows must be consecutive steps ending at {step}")


def check_weights(state: dict, path, model, refuse) -> None:
    """Every tensor the model has, of the shape it has, in the file's own dtype, finite, ties kept."""
    check_fits(state["model"], model, f"resume file {path}: entry 'model'")
    dtype = state["fingerprint"].get("weights_dtype")
    for name, t in state["model"].items():
        if str(t.dtype).removeprefix("torch.") != dtype:
            refuse("model", f"tensor {name} is {t.dtype}, the fingerprint says {dtype}")
        if not torch.isfinite(t).all():
            refuse("model", f"tensor {name} holds {count_nonfinite(t)} non-finite values")
    for name, tied_to in tied_names(model).items():
        if not torch.equal(state["model"][name], state["model"][tied_to]):
            refuse("model", f"tensor {name} differs from {tied_to}, which the model ties it to")


def check_optimizer_state(saved: dict, optimizer, updates: int, refuse) -> None:
    """AdamW's state as this run's optimizer would hold it after UPDATES updates."""
    built = optimizer.state_dict()
    groups, state = saved.get("param_groups"), saved.get("state")
    if not isinstance(groups, list) or not isinstance(state, dict):
        refuse("optimizer", "lacks 'param_groups' or 'state'")
    if len(groups) != len(built["param_groups"]):
        refuse("optimizer", f"has {len(groups)} parameter groups, this run's optimizer {len(built['param_groups'])}")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for saved_group, group in zip(groups, built["param_groups"]):
        if not isinstance(saved_group, dict) or saved_group.get("params") != group["params"]:
            refuse("optimizer", "has parameter groups that list other parameters than this run's")
        # lr is set every step from the schedule; every other hyperparameter must be this run's
        differing = [k for k in group if k not in ("params", "lr") and saved_group.get(k) != group[k]]
        if differing:
            refuse("optimizer", "has other hyperparameters: " + ", ".join(
                f"{k} {saved_group.get(k)} in the file, {group[k]} now" for k in differing))
    if set(state) != set(range(len(params))) or not all(type(k) is int for k in state):
        refuse("optimizer", f"holds state for {len(state)} parameters, this run has {len(params)}")
    for i, p in enumerate(params):
        entry = state[i]
        if not isinstance(entry, dict) or sorted(entry) != ["exp_avg", "exp_avg_sq", "step"]:
            refuse("optimizer", f"state of parameter {i} is not AdamW's exp_avg, exp_avg_sq and step")
        for k in ("exp_avg", "exp_avg_sq"):
            t = entry[k]
            if not isinstance(t, torch.Tensor) or t.shape != p.shape or t.dtype != p.dtype:
                refuse("optimizer", f"{k} of parameter {i} is not a {p.dtype} tensor of shape {list(p.shape)}")
            if not torch.isfinite(t).all():
                refuse("optimizer", f"{k} of parameter {i} holds {count_nonfinite(t)} non-finite values")
        if (entry["exp_avg_sq"] < 0).any():
            refuse("optimizer", f"exp_avg_sq of parameter {i} is negative somewhere (it is a mean of squares)")
        counter = entry["step"]
        if not isinstance(counter, torch.Tensor) or counter.numel() != 1 or counter.item() != updates:
            refuse("optimizer", f"step of parameter {i} is {counter!r}, the file's step says {updates} updates")


def tied_names(model) -> dict:
    """{name: the first name of the same tensor} for every state_dict entry the model ties to another."""
    first, tied = {}, {}
    for name, t in model.state_dict(keep_vars=True).items():
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()))
        if key in first:
            tied[name] = first[key]
        else:
            first[key] = name
    return tied


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
