"""mmkit: MiniMind model, data, training loop and checkpoint I/O shared by every script of the workflow."""

from .checkpoint import load_model  # noqa: F401  (the task's mmkit.load_model)
