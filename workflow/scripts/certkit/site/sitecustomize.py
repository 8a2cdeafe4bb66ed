"""Loaded by every Python process of a command that certify runs (this folder is put first on PYTHONPATH).

It imports nothing heavy: once the process itself imports torch, the recorder's hooks are registered (a
launcher that never trains, such as torchrun's agent, writes nothing). Then it hands over to whichever
sitecustomize the process would have loaded without certify.
"""

import importlib.abc
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of `torch` so that the recorder installs once torch is loaded."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_record(module):
            exec_module(module)
            sys.path.insert(0, os.path.dirname(os.path.dirname(_HERE)))  # the folder holding certkit
            try:
                from certkit import recorder
            finally:
                sys.path.pop(0)
            found = recorder.from_environment()
            if found is not None:
                found.install()

        spec.loader.exec_module = exec_and_record
        return spec


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
