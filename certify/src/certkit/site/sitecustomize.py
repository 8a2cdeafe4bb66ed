"""Loaded by every Python process of a command that certify runs (this folder is put first on PYTHONPATH).

It imports nothing heavy: once the process itself imports torch, the recorder's hooks are registered (a
launcher that never trains, such as torchrun's agent, writes nothing). Then it hands over to whichever
sitecustomize the process would have loaded without certify. Nothing here may break the process: a recorder
that cannot install says so on stderr and in the certificate folder, and the program runs on unrecorded.
"""

import importlib.abc
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of every spec of `torch` looked up until one is executed.

    A lookup is not an import: `importlib.util.find_spec("torch")` (transformers' and datasets' check that
    torch is there) returns a spec nobody executes, and the import after it gets a fresh one. So the finder
    stays on sys.meta_path, wrapping each spec, until the first wrapped loader actually runs torch."""

    def __init__(self):
        self.looking = False

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or self.looking:
            return None
        self.looking = True  # the lookup below asks sys.meta_path again, this finder included
        try:
            spec = importlib.util.find_spec("torch")
        finally:
            self.looking = False
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_record(module):
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            exec_module(module)
            _install()

        spec.loader.exec_module = exec_and_record
        return spec


def _install() -> None:
    """The recorder's hooks registered; any failure reported, never raised into the program."""
    try:
        holder = os.path.dirname(os.path.dirname(_HERE))  # the folder holding certkit
        sys.path.insert(0, holder)
        try:
            from certkit import recorder
        finally:
            sys.path.remove(holder)
        found = recorder.from_environment()
        if found is not None:
            found.install()
    except Exception as e:  # noqa: BLE001  (whatever it is, the program must go on)
        print(f"certify: not recorded: the recorder did not install ({type(e).__name__}: {e})", file=sys.stderr)
        try:
            folder = os.environ["CERTIFY_RECORD"]
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"notes.{os.getpid()}.txt"), "a") as f:
                f.write(f"the recorder did not install ({type(e).__name__}: {e})\n")
        except OSError:
            pass


def _chain() -> None:
    """Import the sitecustomize that comes after this one on sys.path, if any."""
    ours = sys.modules.pop("sitecustomize")
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    try:
        import sitecustomize  # noqa: F401  (the next one, run for its effects)
    except ModuleNotFoundError as e:
        if e.name != "sitecustomize":
            raise
    finally:
        sys.path[:] = saved
        sys.modules["sitecustomize"] = ours


if os.environ.get("CERTIFY_RECORD"):
    sys.meta_path.insert(0, _AfterTorch())
_chain()
