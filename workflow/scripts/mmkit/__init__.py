"""mmkit: MiniMind model, data, training loop and checkpoint I/O shared by every script of the workflow.

Modules: model, data, train (the loop), checkpoint (what is saved and how it is read back),
atomic (how any file is committed), config, report, plots, export, errors.
"""
