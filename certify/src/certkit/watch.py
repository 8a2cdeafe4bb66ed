"""What the recorder watches besides the steps, for the diagnosis of a resume that is not exact (diagnosis.py):
the program's saves and one step's draws from the global RNGs, each with the line of the user's code that
made it. Loaded into the user's process; imports torch, numpy and the standard library only.

  saves.<pid>.jsonl  every torch.save (and safetensors' save_file): the steps done, the user's line, the
                     floating dtypes of the tensors saved, the path. A save that stores fp16 weights shows
                     here; so does a file written by native code that the audit hook's writes.<pid>.txt misses.
  draws.<pid>.jsonl  the draws from torch's, numpy's and Python's global generators in one window (from the
                     end of step K, or the process's start, to step K + 1's update): the call, the user's line,
                     a digest of the generator's state after it. A call that left the state as it was drew
                     nothing and is not written.

Both observe: each wrapper calls what it wraps with the arguments it got and returns what that returned; an
error inside the observation is noted (NOTE) and never raised into the program.
"""

import functools
import hashlib
import json
import os
import random
import sys
import threading

import numpy as np

from .digest import rng_states

# the innermost frame outside these is the user's: the interpreter, installed packages, certify itself
_HERE = os.path.dirname(os.path.abspath(__file__))
_OUTSIDE = tuple(sorted({os.path.join(os.path.realpath(p), "") for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
                        | {os.path.join(_HERE, ""), "/usr/"}))

PYTHON_DRAWS = ("random", "randint", "randrange", "choice", "choices", "shuffle", "sample", "uniform", "gauss",
                "normalvariate", "lognormvariate", "expovariate", "betavariate", "triangular", "getrandbits")
NUMPY_DRAWS = ("rand", "randn", "randint", "random", "random_sample", "ranf", "sample", "choice", "shuffle",
               "permutation", "uniform", "normal", "standard_normal", "binomial", "poisson", "beta", "gamma",
               "exponential", "multinomial", "bytes")
TORCH_DRAWS = frozenset(("rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial", "poisson",
                         "rand_like", "randn_like", "randint_like", "uniform_", "normal_", "random_", "bernoulli_",
                         "exponential_", "geometric_", "cauchy_", "log_normal_", "dropout", "dropout1d", "dropout2d",
                         "dropout3d", "alpha_dropout", "feature_alpha_dropout", "rrelu", "native_dropout"))


def user_line(frame=None) -> str | None:
    """file:line of the innermost frame of the user's code (not the interpreter's, a package's or certify's)."""
    frame = frame or sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(("<", *_OUTSIDE)):
            shown = os.path.relpath(name)
            return f"{name if shown.startswith('..') else shown}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _state(kind: str) -> str:
    if kind == "python":
        return hashlib.sha1(repr(random.getstate()).encode()).hexdigest()[:16]
    return rng_states()[f"rng_{kind}"]


class Watch:
    """Writes FOLDER/saves.<pid>.jsonl and draws.<pid>.jsonl; STEP() gives the optimizer steps done."""

    def __init__(self, folder, step, note):
        self.folder, self.step, self.note = folder, step, note
        self.files, self.lock = {}, threading.Lock()
        self.tracing, self.unwrap, self.mode = False, [], None

    def write(self, name: str, row: dict) -> None:
        with self.lock:
            if name not in self.files:
                os.makedirs(self.folder, exist_ok=True)
                self.files[name] = open(os.path.join(self.folder, f"{name}.{os.getpid()}.jsonl"), "a")
            self.files[name].write(json.dumps(row) + "\n")
            self.files[name].flush()

    # --- saves ---------------------------------------------------------------------------------------

    def watch_saves(self) -> None:
        import importlib.util

        import torch

        self._wrap_save(torch, "save")
        if importlib.util.find_spec("safetensors") is not None:
            import safetensors.torch

            self._wrap_save(safetensors.torch, "save_file")

    def _wrap_save(self, module, name: str) -> None:
        real = getattr(module, name)

        @functools.wraps(real)
        def save(*args, **kwargs):
            try:
                where = args[1] if len(args) > 1 else kwargs.get("f", kwargs.get("filename"))
                self._saved(f"{module.__name__}.{name}", args[0] if args else kwargs.get("obj", kwargs.get("tensors")),
                            where, sys._getframe(1))
            except Exception as e:  # noqa: BLE001  (the save goes on, unwatched)
                self.note(f"the program's saves ({type(e).__name__}: {e})")
            return real(*args, **kwargs)

        setattr(module, name, save)

    def _saved(self, call: str, obj, where, frame) -> None:
        """A save of OBJ by CALL from FRAME, to WHERE (a path, or a file object: then no path is noted)."""
        import torch

        dtypes, seen = {}, set()

        def walk(o, depth=0):
            if isinstance(o, torch.Tensor):
                if o.is_floating_point() and id(o) not in seen:
                    seen.add(id(o))
                    dtypes[str(o.dtype).removeprefix("torch.")] = dtypes.get(str(o.dtype).removeprefix("torch."), 0) + 1
            elif depth < 6 and isinstance(o, dict):
                for v in o.values():
                    walk(v, depth + 1)
            elif depth < 6 and isinstance(o, (list, tuple)):
                for v in o:
                    walk(v, depth + 1)

        walk(obj)
        path = os.path.abspath(os.fsdecode(where)) if isinstance(where, (str, bytes, os.PathLike)) else None
        self.write("saves", {"step": self.step(), "call": call, "where": user_line(frame), "dtypes": dtypes,
                             "path": path})

    # --- one step's draws from the global generators ----------------------------------------------------

    def start_draws(self) -> None:
        """Every draw from a global generator recorded until stop_draws (this thread's torch calls)."""
        if self.tracing:
            return
        self.tracing = True
        try:
            for module, names, kind in ((random, PYTHON_DRAWS, "python"), (np.random, NUMPY_DRAWS, "numpy")):
                for name in names:
                    real = getattr(module, name, None)
                    if callable(real):
                        setattr(module, name, self._drawing(real, f"{module.__name__}.{name}", kind))
                        self.unwrap.append((module, name, real))
            self.mode = _torch_mode(self)
            self.mode.__enter__()
        except Exception as e:  # noqa: BLE001
            self.note(f"the global RNGs' draws ({type(e).__name__}: {e})")

    def stop_draws(self) -> None:
        if not self.tracing:
            return
        self.tracing = False
        for module, name, real in reversed(self.unwrap):
            setattr(module, name, real)
        self.unwrap = []
        if self.mode is not None:
            mode, self.mode = self.mode, None
            try:
                mode.__exit__(None, None, None)
            except Exception as e:  # noqa: BLE001  (left on another thread's stack: it records no more)
                self.note(f"the global RNGs' draws ({type(e).__name__}: {e})")

    def _drawing(self, real, call: str, kind: str):
        @functools.wraps(real)
        def draw(*args, **kwargs):
            before = self._before(kind)
            result = real(*args, **kwargs)
            self._after(kind, call, before, sys._getframe(1))
            return result

        return draw

    def _before(self, kind: str) -> str | None:
        try:
            return _state(kind) if self.tracing else None
        except Exception:  # noqa: BLE001
            return None

    def _after(self, kind: str, call: str, before, frame) -> None:
        if before is None or not self.tracing:
            return
        try:
            after = _state(kind)
            if after != before:
                self.write("draws", {"step": self.step(), "rank": int(os.environ.get("RANK", 0)), "rng": kind,
                                     "call": call, "where": user_line(frame), "after": after})
        except Exception as e:  # noqa: BLE001
            self.note(f"the global RNGs' draws ({type(e).__name__}: {e})")


def _torch_mode(watch: Watch):
    """A TorchFunctionMode that notes the torch calls that drew from torch's global generator (a random function
    or a dropout, without a generator of its own: the global state moved)."""
    import torch
    from torch.overrides import TorchFunctionMode

    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)  # torch < 2.3

    class Draws(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if compiling() or getattr(func, "__name__", None) not in TORCH_DRAWS:
                return func(*args, **kwargs)
            before = watch._before("torch")
            result = func(*args, **kwargs)
            watch._after("torch", f"torch.{func.__name__}", before, sys._getframe(1))
            return result

    return Draws()
