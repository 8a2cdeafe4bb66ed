"""The recorder: a row per optimizer step of an unmodified training process, and the kill of a stopped run.

Loaded by certkit/site/sitecustomize.py once the process imports torch, it registers torch's global hooks
and nothing else; they observe and never change what the process computes (but for a repair, below):
  - a forward pre-hook and forward hook on every module: what the outermost module with trainable
    parameters received, under grad mode, since the last step (several forwards under accumulation);
  - an optimizer step pre-hook: the parameters the step starts from, the RNG states, the gradients, each
    group's LR; at CERTIFY_KILL_AT, the kill (under step(closure), where the forward and backward run inside
    the step: when the closure returns);
  - an optimizer step post-hook: the parameters and the optimizer state after the update, the GradScaler's
    scale, and the time by the clock file mtimes are stamped with; then the row is written
    (CERTIFY_RECORD/rank<R>.jsonl, a line per step, flushed).

Nothing a hook does may break the program: a tensor it cannot read (on the meta device, a fake or other
subclass tensor) is skipped, a forward of a model whose parameters are on the meta device (a FLOP counter)
is no training forward, and any error inside a hook is caught and written to notes.<pid>.txt ("not recorded:
why"), never raised into the program. An audit hook notes each file the process opens for reading
(reads.<pid>.txt, with its mtime) and each it opens for writing or renames onto (writes.<pid>.txt): certify
checks that no run read what another run wrote while it trained.

Samples are what the model received, not what a DataLoader yielded: Accelerate and Lightning read a batch
ahead, and Accelerate's resume reads the batches it skips, so a loader's yield moves in time between a
straight and a resumed run while the model's inputs do not. A DataLoader worker's random draws reach the
model inside the batch, so they show as samples.

  CERTIFY_RECORD       the folder of this run's certificates (unset: the recorder stays out of the way)
  CERTIFY_STEP_OFFSET  the step the process starts after (a resumed run: K)
  CERTIFY_KILL_AT      SIGKILL the process group at this step's pre-hook, before its update
  CERTIFY_KEEP_RNG     the straight run: at the first training forward after this step, the global RNGs'
                       raw states are kept (rank<R>.rng.pt beside the certificate)
  CERTIFY_RESTORE_RNG  a repair: that folder's states put back at the same point of a resumed run
  CERTIFY_KEEP_INPUTS  the straight run under --repair: the model's inputs of every training forward after
                       this step kept (rank<R>.inputs.pt)
  CERTIFY_REPLAY_INPUTS  a repair: each training forward after K gets that folder's inputs, copied into its
                       own tensors in place
  CERTIFY_EMPTY_OPTIMIZER  the negative control: the optimizer's per-parameter state (AdamW's moments and
                       counts) emptied before the process's first update, as a checkpoint without it would
                       leave it. The repairs and the control are the only times the recorder changes what a
                       process computes (certify --repair, --control)
  CERTIFY_SAVES        certify --crash: this folder gets every file event under CERTIFY_SAVES_ROOT (fileevents.py)
  CERTIFY_KEEP_FINAL   at a normal exit, the last stepped optimizer's parameters are kept (rank<R>.final.pt):
                       how far apart two runs' final weights are
  CERTIFY_DIGEST_AT    the straight run: this step's row also holds the digests of its parameters after the
                       update rounded to float16 and to bfloat16, and of the optimizer state without its steps
  CERTIFY_KEEP_INPUTS_AT  the model's inputs of this step kept (rank<R>.inputs_at.pt)
  CERTIFY_TRACE_AT     the program's draws from the global RNGs until this step's update, from the end of
                       the step before it or the process's start (watch.py: draws.<pid>.jsonl)
Every run's torch.save calls are noted with their line and dtypes (watch.py: saves.<pid>.jsonl), and a
process's first row holds the optimizer state it started from: what diagnosis.py reads, only when a resume
is not exact.
"""

import atexit
import functools
import json
import os
import random
import signal
import sys
import threading
import time
import weakref
from pathlib import Path

from . import digest, watch

PIECES = ("params_in", "samples", "rng_torch", "rng_numpy", "rng_python", "rng_cuda", "gradients", "scale", "lr", "optimizer",
          "params")


def _observing(hook):
    """HOOK made harmless: an error inside it is noted (once per kind) and the program goes on."""

    @functools.wraps(hook)
    def safe(self, *args, **kwargs):
        try:
            return hook(self, *args, **kwargs)
        except Exception as e:  # noqa: BLE001  (the recorder observes: nothing it does may reach the program)
            self.note(f"{hook.__name__.strip('_')}: {type(e).__name__}: {e}")
            return None

    return safe


def _rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", 0))


class Recorder:
    def __init__(self, folder: str, offset: int = 0, kill_at: int | None = None, keep_rng: int | None = None,
                 restore_rng: str | None = None, keep_inputs: int | None = None, replay_inputs: str | None = None,
                 empty_optimizer: bool = False, keep_final: bool = False, digest_at: int | None = None,
                 keep_inputs_at: int | None = None, trace_at: int | None = None):
        self.folder, self.step, self.kill_at = Path(folder), offset, kill_at
        self.empty_optimizer, self.keep_final, self.stepped = empty_optimizer, keep_final, None
        # the RNGs' raw states at the first training forward after step K: kept, or put back (a repair)
        self.rng_at = offset if restore_rng else keep_rng
        self.restore_rng = Path(restore_rng) if restore_rng else None
        # the model's inputs after step K: kept (KEEP_INPUTS), or replayed from a kept list (a repair)
        self.keep_inputs, self.kept = keep_inputs, []
        self.replay = Path(replay_inputs) if replay_inputs else None
        self.replayed = None
        self.inputs, self.row, self.file = [], None, None
        self.digest_at, self.keep_inputs_at, self.trace_at, self.at_inputs = digest_at, keep_inputs_at, trace_at, []
        self.watch = None
        self.local = threading.local()  # forward nesting depth, per thread
        self.trainable = weakref.WeakKeyDictionary()
        self.scalers, self.handles = (), []
        self.noted, self.read, self.written, self.write_log = set(), set(), set(), None
        self.own = self.folder.parent.resolve()  # certify's --out: its own files are not the program's reads

    def note(self, why: str) -> None:
        """A line of notes.<pid>.txt: something the recorder could not record, and why (once per why)."""
        if why in self.noted:
            return
        self.noted.add(why)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(self.folder / f"notes.{os.getpid()}.txt", "a") as f:
                f.write(why.replace("\n", " ") + "\n")
        except OSError:
            pass

    def _on_audit(self, event: str, args) -> None:
        """The files the program opens for reading (a path, once each), with their mtime when first read; the
        files it opens for writing or renames onto (os.rename, os.replace), once each."""
        if event not in ("open", "os.rename") or not self.read_log:
            return
        try:
            path, mode = (args[0], args[1]) if event == "open" else (args[1], "w")
            if not isinstance(path, (str, bytes, os.PathLike)):
                return
            path = os.path.abspath(os.fsdecode(path))
            if mode is not None and set(str(mode)) & set("wax+"):
                self._wrote(path)
                return
            if path in self.read or path.endswith((".py", ".pyc", ".so")) or path.startswith(SYSTEM):
                return
            self.read.add(path)
            if path.startswith(str(self.own) + os.sep) and not path.startswith(str(self.own / "runs") + os.sep):
                return
            mtime = os.stat(path).st_mtime_ns
            self.read_log.write(f"{mtime}\t{path}\n")
            self.read_log.flush()
        except Exception:  # noqa: BLE001  (a file that vanished, a path it cannot decode: not a read it can judge)
            pass

    def _wrote(self, path: str) -> None:
        if path in self.written or path.startswith(str(self.own) + os.sep) and not path.startswith(
                str(self.own / "runs") + os.sep):
            return
        self.written.add(path)
        if self.write_log is None:
            self.write_log = open(self.folder / f"writes.{os.getpid()}.txt", "a")
        self.write_log.write(path + "\n")
        self.write_log.flush()

    def install(self) -> None:
        import torch
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.handles = [register_module_forward_pre_hook(self._enter),
                        register_module_forward_hook(self._leave, with_kwargs=True, always_call=True),
                        register_optimizer_step_pre_hook(self._before_step),
                        register_optimizer_step_post_hook(self._after_step)]
        if not hasattr(torch.amp.GradScaler, "_certify_scalers"):
            scaler_init = torch.amp.GradScaler.__init__

            def init(scaler, *args, **kwargs):  # only to know which scalers exist
                scaler_init(scaler, *args, **kwargs)
                torch.amp.GradScaler._certify_scalers.add(scaler)

            torch.amp.GradScaler._certify_scalers = weakref.WeakSet()
            torch.amp.GradScaler.__init__ = init
        self.scalers = torch.amp.GradScaler._certify_scalers
        if os.environ.get("CERTIFY_SAVES"):  # certify --crash: the stopped run's file events
            try:
                from . import fileevents

                fileevents.install(os.environ["CERTIFY_SAVES_ROOT"], os.environ["CERTIFY_SAVES"], lambda: self.step,
                              self.note)
            except Exception as e:  # noqa: BLE001  (the program runs on, its saves unrecorded)
                self.note(f"the saves' file events ({type(e).__name__}: {e})")
        try:
            self.watch = watch.Watch(self.folder, lambda: self.step, self.note)
            self.watch.watch_saves()
            if self.trace_at == self.step + 1:  # a resumed run: its draws from its start to its first update
                self.watch.start_draws()
        except Exception as e:  # noqa: BLE001  (the program runs on, its saves and draws unwatched)
            self.note(f"the program's saves and draws ({type(e).__name__}: {e})")
        self.read_log = None
        if not os.environ.get("CERTIFY_NO_READS"):
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                self.read_log = open(self.folder / f"reads.{os.getpid()}.txt", "a")
                sys.addaudithook(self._on_audit)
            except OSError as e:
                self.note(f"the files it reads ({e.strerror})")

    def remove(self) -> None:
        """The hooks taken out again (the bench times steps with and without them in one process)."""
        for handle in self.handles:
            handle.remove()
        self.read_log = None  # an audit hook cannot be removed: it stops noting

    # --- the model's inputs ----------------------------------------------------------------------

    def _enter(self, module, args) -> None:
        depth = getattr(self.local, "depth", 0)
        self.local.depth = depth + 1
        if depth == 0:
            self.local.outer = False
            self._enter_outer(module, args)

    @_observing
    def _enter_outer(self, module, args) -> None:
        if not self._is_training_call(module):
            return
        unread = [t for t in tensors_in(args) if not digest.readable(t)]
        if unread:
            self.note(f"a forward of {type(module).__name__} with a {type(unread[0]).__name__} on "
                      f"{unread[0].device.type} among its inputs: not recorded as samples")
            return
        self.local.outer = True
        if self.replay is not None:
            self._replay_inputs(args)
        if self.rng_at is not None and self.step == self.rng_at:
            self.rng_at = None
            self._keep_or_restore_rng()

    def _replay_inputs(self, args) -> None:
        """This forward's tensors overwritten, in place, with the straight run's of the same forward after K.
        A hook sees only the positional arguments: the keyword ones are those of torch's call frame above."""
        import torch

        if self.replayed is None:
            self.replayed = iter(torch.load(self.replay / f"rank{_rank()}.inputs.pt", weights_only=True))
        reference = next(self.replayed, None)
        frame = sys._getframe(1)
        while frame is not None and "forward_call" not in frame.f_locals:  # Module._call_impl's frame
            frame = frame.f_back
        kwargs = frame.f_locals.get("kwargs", {}) if frame is not None else {}
        if reference is None:
            return
        for ours, theirs in zip(tensors_in([args, kwargs]), reference):
            if ours.shape == theirs.shape and ours.dtype == theirs.dtype:
                with torch.no_grad():
                    ours.copy_(theirs)

    def _keep_or_restore_rng(self) -> None:
        import torch

        if self.restore_rng is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            torch_save(raw_rng_states(), self.folder / f"rank{_rank()}.rng.pt")
        else:
            set_raw_rng_states(torch.load(self.restore_rng / f"rank{_rank()}.rng.pt", weights_only=True))

    def _leave(self, module, args, *kwargs_and_output) -> None:
        # (kwargs, output) as asked (with_kwargs=True); but where the forward raised (activation checkpointing
        # stops its recompute that way), torch calls an always_call hook as (module, args, output)
        kwargs = kwargs_and_output[0] if len(kwargs_and_output) == 2 else {}
        self.local.depth = max(getattr(self.local, "depth", 1) - 1, 0)
        if self.local.depth == 0 and getattr(self.local, "outer", False):
            self.local.outer = False
            self._leave_outer(args, kwargs)

    @_observing
    def _leave_outer(self, args, kwargs) -> None:
        self.inputs.append(digest.of_object([args, kwargs]))
        if self.keep_inputs is not None and self.step >= self.keep_inputs:
            self.kept.append([t.detach().cpu().clone() for t in tensors_in([args, kwargs])])
        if self.keep_inputs_at == self.step + 1:
            self.at_inputs.append([t.detach().cpu().clone() for t in tensors_in([args, kwargs])])

    def _is_training_call(self, module) -> bool:
        import torch

        if not torch.is_grad_enabled() or torch._C._current_graph_task_id() != -1:  # eval, or a recompute in backward
            return False
        if module not in self.trainable:
            self.trainable[module] = any(p.requires_grad for p in module.parameters())
        if not self.trainable[module]:
            return False
        # a copy of the model on the meta device (a FLOP counter's forward) trains nothing: not a sample
        if not digest.readable(next(p for p in module.parameters() if p.requires_grad)):
            self.note(f"a forward of {type(module).__name__} whose parameters are on the meta device or fake: "
                      "not recorded as samples")
            return False
        return True

    # --- the optimizer step ----------------------------------------------------------------------

    @_observing
    def _before_step(self, optimizer, args, kwargs):
        if self.row is not None:  # an optimizer stepping another inside its own step: one row
            return None
        closure = kwargs["closure"] if "closure" in kwargs else args[0] if args else None
        if not callable(closure):
            return self._take_row(optimizer)
        # step(closure), as Lightning steps: the forward and backward run inside the step, so the row is taken
        # when the closure first returns, with what the update will read (the closure is otherwise untouched)
        taken = []

        def recorded(*a, **k):
            result = closure(*a, **k)
            if not taken:
                taken.append(self._take_row(optimizer))
            return result

        return (args, {**kwargs, "closure": recorded}) if "closure" in kwargs else ((recorded, *args[1:]), kwargs)

    @_observing
    def _take_row(self, optimizer) -> None:
        step = self.step + 1
        if self.watch is not None and step == self.trace_at:
            self.watch.stop_draws()
        if self.kill_at is not None and step >= self.kill_at:
            self._write({"killed": step})
            os.fsync(self.file.fileno())
            os.killpg(os.getpgrp(), signal.SIGKILL)  # every rank, its launcher and its workers, unsaved
        if self.empty_optimizer:
            self.empty_optimizer = False
            optimizer.state.clear()  # AdamW starts its moments afresh at this update
        params = [p for group in optimizer.param_groups for p in group["params"]]
        # the parameters the step starts from: the first thing it reads, so a lossy restore of the weights
        # (stored as fp16) is named as itself, not by the gradients it then changes
        self.row = {"step": step, "params_in": digest.of_tensors(params), "samples": digest.of_object(self.inputs),
                    "forwards": len(self.inputs),
                    **digest.rng_states(), "gradients": digest.of_tensors(p.grad for p in params),
                    "lr": [float(group["lr"]) for group in optimizer.param_groups], "optimizer_at": optimizer}
        if self.file is None:  # the process's first step: the optimizer state it starts from (a resume's)
            state = optimizer.state_dict()["state"]
            self.row.update(optimizer_in=digest.of_object(state), optimizer_in_moments=digest.of_object(moments(state)),
                            optimizer_in_empty=not state)
        if self.at_inputs and step == self.keep_inputs_at:
            self.folder.mkdir(parents=True, exist_ok=True)
            torch_save(self.at_inputs, self.folder / f"rank{_rank()}.inputs_at.pt")
            self.at_inputs = []
        self.inputs = []

    @_observing
    def _after_step(self, optimizer, args, kwargs) -> None:
        if self.row is None or self.row["optimizer_at"] is not optimizer:
            return
        row, self.row = self.row, None
        del row["optimizer_at"]
        row["optimizer"] = digest.of_object(optimizer.state_dict()["state"])
        row["params"] = digest.of_tensors(p for group in optimizer.param_groups for p in group["params"])
        row["time_ns"] = file_clock_ns()  # a file written after this step has an mtime no earlier
        scales = [s.get_scale() for s in self.scalers if s.is_enabled()]
        if scales:
            row["scale"] = scales
        self.step = row["step"]
        if self.step == self.digest_at:  # what a lossy restore of these weights would give (diagnosis.py)
            import torch

            params = [p for group in optimizer.param_groups for p in group["params"]]
            row["params_rounded"] = {str(dtype).removeprefix("torch."): digest.of_tensors(
                p.detach().to(dtype).to(p.dtype) for p in params) for dtype in (torch.float16, torch.bfloat16)}
            row["optimizer_moments"] = digest.of_object(moments(optimizer.state_dict()["state"]))
        if self.watch is not None and self.step + 1 == self.trace_at:
            self.watch.start_draws()
        self._write(row)
        if self.keep_final:
            if self.stepped is None:
                atexit.register(self._keep_final)
            # the parameters themselves (updated in place), not the optimizer: it is gone by the time of exit
            self.stepped = [p for group in optimizer.param_groups for p in group["params"]]
        if self.kept:  # all of them, each step: a run may end without a goodbye
            torch_save(self.kept, self.folder / f"rank{self.rank}.inputs.pt")

    def _keep_final(self) -> None:
        torch_save([p.detach().cpu().clone() for p in self.stepped], self.folder / f"rank{self.rank}.final.pt")

    def _write(self, row: dict) -> None:
        if self.file is None:
            rank = _rank()
            self.folder.mkdir(parents=True, exist_ok=True)
            self.file = open(self.folder / f"rank{rank}.jsonl", "w")
            self.rank = rank
        self.file.write(json.dumps({"rank": self.rank, **row}) + "\n")
        self.file.flush()


# where a program's reads are its environment, not its checkpoints: the interpreter, packages, the OS
SYSTEM = tuple(sorted({os.path.join(os.path.realpath(p), "") for p in (sys.prefix, sys.base_prefix)}
                      | {"/proc/", "/sys/", "/dev/", "/etc/", "/usr/"}))


# Linux stamps a file's mtime from its coarse real-time clock, which runs up to a tick behind time.time_ns()
_FILE_CLOCK = 5 if sys.platform.startswith("linux") else None  # CLOCK_REALTIME_COARSE (time has no name for it)


def file_clock_ns() -> int:
    """Now, by the clock file mtimes are stamped with: a file written after this call has an mtime no earlier."""
    if _FILE_CLOCK is not None:
        try:
            return time.clock_gettime_ns(_FILE_CLOCK)
        except OSError:
            pass
    return time.time_ns()


def moments(state: dict) -> dict:
    """An optimizer's per-parameter state without its step counts: AdamW's moments."""
    return {i: {k: v for k, v in entry.items() if k != "step"} for i, entry in state.items()}


def torch_save(obj, path) -> None:
    """torch.save as the program found it, not the watched one: certify's own files are not the program's saves."""
    import torch

    getattr(torch.save, "__wrapped__", torch.save)(obj, path)


def tensors_in(obj) -> list:
    """The tensors of a call's arguments, in the order the digest walks them."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for key in sorted(obj, key=repr) for t in tensors_in(obj[key])]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in tensors_in(item)]
    return []


def raw_rng_states() -> dict:
    """The global RNGs' states as plain data a weights_only load reads back (numpy's keys as a tensor)."""
    import numpy as np
    import torch

    name, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    states = {"torch": torch.get_rng_state(), "python": [version, list(internal), gauss],
              "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_raw_rng_states(states: dict) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(states["torch"])
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


def from_environment() -> Recorder | None:
    folder = os.environ.get("CERTIFY_RECORD")
    if not folder:
        return None
    number = {k: int(os.environ[k]) if os.environ.get(k) else None
              for k in ("CERTIFY_KILL_AT", "CERTIFY_KEEP_RNG", "CERTIFY_KEEP_INPUTS", "CERTIFY_DIGEST_AT",
                        "CERTIFY_KEEP_INPUTS_AT", "CERTIFY_TRACE_AT")}
    return Recorder(folder, int(os.environ.get("CERTIFY_STEP_OFFSET", 0)), number["CERTIFY_KILL_AT"],
                    number["CERTIFY_KEEP_RNG"], os.environ.get("CERTIFY_RESTORE_RNG"), number["CERTIFY_KEEP_INPUTS"],
                    os.environ.get("CERTIFY_REPLAY_INPUTS"), bool(os.environ.get("CERTIFY_EMPTY_OPTIMIZER")),
                    bool(os.environ.get("CERTIFY_KEEP_FINAL")), number["CERTIFY_DIGEST_AT"],
                    number["CERTIFY_KEEP_INPUTS_AT"], number["CERTIFY_TRACE_AT"])
