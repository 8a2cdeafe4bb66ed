"""What a resume holds: one table of entries, each taken from a piece of the live training state that saves,
restores and checks itself.

A piece is Stateful: state_dict() gives the value a resume file holds, load_state_dict(value) puts it back,
and check(value, the whole resume, Checking) refuses, before a single step runs, what this run could not
continue from bit for bit (None: nothing to check). The data's pieces live in mmkit.data, the others here.
Each row of ENTRIES names an entry, its type, its piece, whether a digest seals it, and says in one line
what it is (docs/checkpoints.md's table is generated from it). Saving, loading, the seal, the DCP
directory's metadata and the checks all iterate over this table, and each ablation (mmkit.ablations) names
the entries it throws away. Adding a piece of state is one class (or a method on one) and one row.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .. import fingerprint
from .files import check_fits, count_nonfinite, digest
from ..errors import UserError
from ..parallel import Ranks, model_state, optimizer_state, unwrap


class LossLog(list):
    """[(step, loss)] of the steps this run trained; a restart of the same run rewrites the same log."""

    def state_dict(self) -> list:
        return list(self)

    def load_state_dict(self, rows) -> None:
        self[:] = [tuple(row) for row in rows]

    @staticmethod
    def check(rows, saved, ctx):
        check_loss_log(rows, saved, ctx)


@dataclass
class TrainingState:
    """Everything the next step depends on, live: the loop trains it, a save takes it, a resume restores it."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    batch_generator: torch.Generator  # the windows' draws: its state is their data position
    # mmkit.data's WindowBatches or EpochBatches: yields batches, keeps .position (the next one's) and the
    # generator's state: the data's two pieces of a resume
    batches: object
    scaler: torch.amp.GradScaler | None  # fp16 only
    ranks: Ranks
    fingerprint: dict
    step: int = 0  # the last optimizer step taken
    skipped_steps: int = 0  # updates skipped for a non-finite loss (or an fp16 overflow)
    # AdamW's own step counter is step - skipped_steps - this: 0, unless a resume started AdamW afresh
    # (--no-optim: then the resume's step) or moved the step under it (--minimind-rescale)
    adamw_offset: int = 0
    loss_log: LossLog = field(default_factory=LossLog)
    # which run this is: the resume it started from (sha256) and the ablations applied then
    origin: dict = field(default_factory=lambda: {"resume_sha256": None, "ablations": []})


# --- the pieces kept here (the data's: mmkit.data) ----------------------------------------------------


class Field:
    """A plain value of the TrainingState (a counter, the fingerprint, the origin), with its check."""

    def __init__(self, live: TrainingState, name: str, check: Callable | None = None):
        self.live, self.name, self.check = live, name, check

    def state_dict(self):
        return getattr(self.live, self.name)

    def load_state_dict(self, value) -> None:
        setattr(self.live, self.name, value)


class Weights:
    """The model's full state_dict, gathered from every rank's shards under FSDP2."""

    def __init__(self, model, ranks: Ranks):
        self.model, self.ranks = model, ranks

    def state_dict(self) -> dict:
        return model_state(self.model, self.ranks)

    def load_state_dict(self, weights: dict) -> None:
        unwrap(self.model).load_state_dict(weights)

    @staticmethod
    def check(weights, saved, ctx):
        check_weights(weights, saved, ctx)


class AdamWState:
    """AdamW's exp_avg, exp_avg_sq and step per parameter, and its parameter groups."""

    def __init__(self, model, optimizer, ranks: Ranks):
        self.model, self.optimizer, self.ranks = model, optimizer, ranks

    def state_dict(self) -> dict:
        return optimizer_state(self.model, self.optimizer, self.ranks)

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)

    @staticmethod
    def check(state, saved, ctx):
        check_optimizer_state(state, saved, ctx)


class GlobalRNG:
    """The global RNG, which draws dropout's masks: {"cpu": state, "cuda": state or None}."""

    def state_dict(self) -> dict:
        return {"cpu": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized()
                else None}

    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(state["cpu"])
        if state["cuda"] is not None:
            torch.cuda.set_rng_state(state["cuda"])

    @staticmethod
    def check(state, saved, ctx):
        check_rng_state(state, saved, ctx)


class LossScale:
    """fp16's GradScaler: its loss scale and growth tracker (None without fp16)."""

    def __init__(self, scaler):
        self.scaler = scaler

    def state_dict(self) -> dict | None:
        return self.scaler.state_dict() if self.scaler else None

    def load_state_dict(self, state) -> None:
        if self.scaler:
            self.scaler.load_state_dict(state)

    @staticmethod
    def check(state, saved, ctx):
        check_scaler_state(state, saved, ctx)


# --- how each entry is checked: check(value, saved, ctx) calls ctx.refuse(why) -----------------------


@dataclass
class Checking:
    """What a resume is checked against: this run's live state, the data position it expects after a step."""

    live: TrainingState
    expected: object  # mmkit.data.Expected: the data position after each step, the last step of this run
    source: str
    entry: str = ""  # the entry being checked, named by a refusal

    def refuse(self, what):
        raise UserError(f"{self.source}: entry '{self.entry}' {what}")


def check_step(step, saved, ctx):
    if not 1 <= step < ctx.expected.last_step:
        ctx.refuse(f"is {step}; this run can continue only from a step in 1..{ctx.expected.last_step - 1}")


def check_skipped_steps(skipped, saved, ctx):
    if not 0 <= skipped <= saved["step"]:
        ctx.refuse(f"is {skipped}; it must lie in 0..step ({saved['step']})")


def check_weights(weights, saved, ctx):
    """Every tensor the model has, of the shape it has, in the file's own dtype, finite, ties kept."""
    model = unwrap(ctx.live.model)
    check_fits(weights, model, f"{ctx.source}: entry '{ctx.entry}'")
    dtype = saved["fingerprint"].get("weights_dtype")
    for name, t in weights.items():
        if str(t.dtype).removeprefix("torch.") != dtype:
            ctx.refuse(f"tensor {name} is {t.dtype}, the fingerprint says {dtype}")
    refusal = weights_refusal(weights)
    if refusal:
        ctx.refuse(refusal)
    for name, tied_to in tied_names(model).items():
        if not torch.equal(weights[name], weights[tied_to]):
            ctx.refuse(f"tensor {name} differs from {tied_to}, which the model ties it to")


def adamw_updates(optimizer) -> int:
    """The updates AdamW has made (its per-parameter step counter; 0 before the first)."""
    return max((int(s["step"]) for s in optimizer.state.values() if "step" in s), default=0)


def updates_of(saved) -> int:
    return saved["step"] - saved["skipped_steps"] - saved["adamw_offset"]


def check_adamw_offset(offset, saved, ctx):
    """AdamW's updates may be ahead of the step (a rescale moved the step back), never beyond the run's steps."""
    steps = ctx.live.fingerprint["steps"]
    if not 0 <= updates_of(saved) <= steps:
        ctx.refuse(f"is {offset}; AdamW's updates (step - skipped_steps - this) must lie in 0..steps ({steps})")


def other_hyperparameters(saved_group: dict, group: dict) -> str:
    """Which of this run's AdamW hyperparameters a saved parameter group holds otherwise ('' if none); lr is
    set every step from the schedule, every other one must be this run's."""
    differing = [k for k in group if k not in ("params", "lr") and saved_group.get(k) != group[k]]
    return ", ".join(f"{k} {saved_group.get(k)} in the file, {group[k]} now" for k in differing)


def check_optimizer_state(value, saved, ctx):
    """AdamW's state as this run's optimizer would hold it after the file's step less its skipped steps (and
    the steps before AdamW was started afresh)."""
    refuse, optimizer, updates = ctx.refuse, ctx.live.optimizer, updates_of(saved)
    built = optimizer.state_dict()
    groups, state = value.get("param_groups"), value.get("state")
    if not isinstance(groups, list) or not isinstance(state, dict):
        refuse("lacks 'param_groups' or 'state'")
    if len(groups) != len(built["param_groups"]):
        refuse(groups_refusal(groups, built["param_groups"]))
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for saved_group, group in zip(groups, built["param_groups"]):
        if not isinstance(saved_group, dict) or saved_group.get("params") != group["params"]:
            refuse("has parameter groups that list other parameters than this run's")
    refusal = groups_refusal(groups, built["param_groups"])
    if refusal:
        refuse(refusal)
    if set(state) != set(range(len(params))) or not all(type(k) is int for k in state):
        refuse(f"holds state for {len(state)} parameters, this run has {len(params)}")
    for i, p in enumerate(params):
        entry = state[i]
        if not isinstance(entry, dict) or sorted(entry) != ["exp_avg", "exp_avg_sq", "step"]:
            refuse(f"state of parameter {i} is not AdamW's exp_avg, exp_avg_sq and step")
        for k in ("exp_avg", "exp_avg_sq"):
            t = entry[k]
            if not isinstance(t, torch.Tensor) or t.shape != p.shape or t.dtype != p.dtype:
                refuse(f"{k} of parameter {i} is not a {p.dtype} tensor of shape {list(p.shape)}")
        refusal = adamw_state_refusal(f"parameter {i}", entry, updates)
        if refusal:
            refuse(refusal)


# --- the checks of tensors' values, shared by a file's whole tensors and a DCP directory's shards ---------


def local(t):
    """A DTensor's shard on this rank (FSDP2), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def weights_refusal(weights: dict) -> str | None:
    for name, t in weights.items():
        if isinstance(t, torch.Tensor) and not torch.isfinite(local(t)).all():
            return f"tensor {name} holds {count_nonfinite(local(t))} non-finite values"
    return None


def groups_refusal(groups: list, built_groups: list) -> str | None:
    """AdamW's parameter groups: as many as this run's, with its hyperparameters."""
    if len(groups) != len(built_groups):
        return f"has {len(groups)} parameter groups, this run's optimizer {len(built_groups)}"
    for saved_group, group in zip(groups, built_groups):
        differing = other_hyperparameters(saved_group, group)
        if differing:
            return f"has other hyperparameters: {differing}"
    return None


def adamw_state_refusal(name: str, entry: dict, updates: int) -> str | None:
    """One parameter's AdamW state (NAME: 'parameter 3', or its fqn in a DCP directory): finite moments, a
    mean of squares never negative, and the counter at the UPDATES the resume's step implies."""
    for k in ("exp_avg", "exp_avg_sq"):
        t = local(entry[k])
        if not torch.isfinite(t).all():
            return f"{k} of {name} holds {count_nonfinite(t)} non-finite values"
    if (local(entry["exp_avg_sq"]) < 0).any():
        return f"exp_avg_sq of {name} is negative somewhere (it is a mean of squares)"
    counter = entry["step"]
    if not isinstance(counter, torch.Tensor) or counter.numel() != 1 or counter.item() != updates:
        return f"step of {name} is {counter!r}, the file's step says {updates} updates"
    return None


def check_rng_state(saved, _, ctx):
    now = GlobalRNG().state_dict()
    if set(saved) != set(now):
        ctx.refuse(f"has {sorted(saved)}, not {sorted(now)}")
    for device, t in saved.items():
        if now[device] is None and t is None:
            continue
        if not (isinstance(t, torch.Tensor) and now[device] is not None and t.dtype == torch.uint8
                and t.shape == now[device].shape):
            ctx.refuse(f"'{device}' is not a {device} RNG state of this torch")


def check_scaler_state(saved, _, ctx):
    """None without fp16; with it, GradScaler's own keys, a finite positive scale."""
    scaler = ctx.live.scaler
    if scaler is None:
        if saved is not None:
            ctx.refuse("holds a GradScaler's state, but this run has no fp16 loss scaling")
        return
    built = scaler.state_dict()
    if not isinstance(saved, dict) or saved.keys() != built.keys():
        ctx.refuse(f"is not a GradScaler's state ({sorted(built)})")
    scale = saved["scale"]
    if not (isinstance(scale, float) and math.isfinite(scale) and scale > 0):
        ctx.refuse(f"has loss scale {scale!r}, not a finite positive number")
    differing = [k for k in ("growth_factor", "backoff_factor", "growth_interval") if saved[k] != built[k]]
    if differing:
        ctx.refuse("has other settings: " + ", ".join(f"{k} {saved[k]} in the file, {built[k]} now"
                                                               for k in differing))


def check_loss_log(rows, saved, ctx):
    """(step, loss) rows of consecutive steps ending at the file's step (none: a file with no log of its own)."""
    step = saved["step"]
    for i, row in enumerate(rows):
        if not (isinstance(row, (tuple, list)) and len(row) == 2 and type(row[0]) is int
                and isinstance(row[1], float)):
            ctx.refuse(f"row {i} is {row!r}, not (step, loss)")
        if row[0] != step - len(rows) + 1 + i:
            ctx.refuse(f"row {i} is of step {row[0]}; the rows must be consecutive steps ending at {step}")


# --- the table ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    name: str
    kind: type | tuple  # what the file must hold
    piece: Callable  # live TrainingState -> the Stateful piece that holds it
    about: str  # one line: what it is and why a resume needs it
    sealed: bool = True  # its sha256 is recorded at save and compared at load
    restored: bool = True  # False: compared (the fingerprint), never put back
    sharded: bool = False  # under FSDP2 it lives in the DCP shard files, not in the directory's resume.pth
    of_run: bool = False  # the run's own record: put back only when the same run restarts (auto-resume)


ENTRIES = (
    Entry("step", int, lambda s: Field(s, "step", check_step),
          "the last optimizer step taken: the LR schedule continues from it, counted on the total steps"),
    Entry("skipped_steps", int, lambda s: Field(s, "skipped_steps", check_skipped_steps),
          "updates skipped for a non-finite loss or an fp16 overflow: AdamW counted step less these"),
    Entry("model", dict, lambda s: Weights(s.model, s.ranks),
          "the weights, in fp32: half precision here would change the next step", sharded=True),
    # checked before the optimizer's counters, which it says how to count
    Entry("adamw_offset", int, lambda s: Field(s, "adamw_offset", check_adamw_offset),
          "steps AdamW did not count (an ablation's fresh optimizer, a rescaled step)"),
    Entry("optimizer", dict, lambda s: AdamWState(s.model, s.optimizer, s.ranks),
          "AdamW's exp_avg and exp_avg_sq per parameter, and its step", sharded=True),
    Entry("gen_state", torch.Tensor, lambda s: s.batches.generator_state,
          "the batch generator's state: the windows' data position (one generator for all ranks)"),
    Entry("data_position", dict, lambda s: s.batches,
          "the data position as a value, {epoch, batches of it read}: the minimind format's whole position"),
    Entry("rng_state", dict, lambda s: GlobalRNG(), "the global RNG states, CPU and CUDA: dropout's masks"),
    Entry("scaler", (dict, type(None)), lambda s: LossScale(s.scaler),
          "fp16's GradScaler: its loss scale and growth tracker (None without fp16)"),
    Entry("fingerprint", dict, lambda s: Field(s, "fingerprint"),
          "what must match for the continuation to be bit-exact (mmkit.fingerprint compares it first)",
          sealed=False, restored=False),
    Entry("origin", dict, lambda s: Field(s, "origin"),
          "the resume this run started from and its ablations: auto-resume takes only its own run's",
          of_run=True),
    Entry("loss_log", list, lambda s: s.loss_log, "(step, loss) of every step trained: a restart rewrites the same log",
          of_run=True),
)
BY_NAME = {e.name: e for e in ENTRIES}
NAMES = tuple(BY_NAME) + ("digests",)  # every key of a resume file


def resume_state(live: TrainingState) -> dict:
    """Everything step+1 depends on. Leave one out and the resumed run silently differs.

    One file at world size 1 and under DDP (sealed as it is saved); under FSDP2 the sharded entries go to DCP
    files and the rest, sealed, to the directory's resume.pth (mmkit.checkpoint.dcp).
    """
    return {e.name: e.piece(live).state_dict() for e in ENTRIES}


def sealed(state: dict) -> tuple:
    """The sealed keys of STATE: every sealed entry it holds (a DCP directory's resume.pth adds its manifest)."""
    return tuple(e.name for e in ENTRIES if e.sealed and e.name in state) + (("manifest",) if "manifest" in state else ())


def seal(state: dict) -> dict:
    """Add the sha256 of each entry: an edit or a flipped bit that no other check sees is still refused."""
    return {**state, "digests": {k: digest(state[k]) for k in sealed(state)}}


def check_types(state, names, source: str) -> dict:
    """STATE is a dict of this code's format (its fingerprint's version, checked first: an older file is
    refused by its version, not by the entry it lacks), holding every one of NAMES, each of its entry's type."""
    if not isinstance(state, dict):
        raise UserError(f"{source} holds a {type(state).__name__}, not a resume dict")
    if isinstance(state.get("fingerprint"), dict):  # a file without one lacks it, named below
        fingerprint.check_format(state["fingerprint"], source)
    missing = [k for k in names if k not in state]
    if missing:
        raise UserError(f"{source} lacks {', '.join(repr(k) for k in missing)}")
    kinds = {**{e.name: e.kind for e in ENTRIES}, "digests": dict, "manifest": dict}
    for k in names:
        kind = kinds[k]
        if not isinstance(state[k], kind) or (kind is int and isinstance(state[k], bool)):
            types = " or ".join(t.__name__ for t in (kind if isinstance(kind, tuple) else (kind,)))
            raise UserError(f"{source}: entry '{k}' is of type {type(state[k]).__name__}, not {types}")
    return state


def check(saved: dict, ctx: Checking, skip=()) -> None:
    """Every entry of a resume checked against this run before a single step runs; those in SKIP (thrown
    away by an ablation, or checked by the storage) are not. Each failure is one UserError naming the entry."""
    for e in ENTRIES:
        piece = e.piece(ctx.live)
        if piece.check and e.name not in skip:
            ctx.entry = e.name
            piece.check(saved[e.name], saved, ctx)
    for name in sealed(saved):
        if name not in skip and digest(saved[name]) != saved["digests"].get(name):
            ctx.entry = name
            ctx.refuse("does not match the sha256 recorded when the file was saved (edited or damaged)")


def put(saved: dict, live: TrainingState, skip=(), same_run: bool = False) -> None:
    """Every entry not in SKIP back into LIVE; the run's own record (origin, loss log) only for SAME_RUN."""
    for e in ENTRIES:
        if e.restored and e.name not in skip and (same_run or not e.of_run):
            e.piece(live).load_state_dict(saved[e.name])


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
