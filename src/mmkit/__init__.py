"""mmkit: MiniMind model, data, training loop and checkpoint I/O shared by every script of the workflow.

Modules, by what they hold:
  model.py          MiniMind's decoder (MiniMind2, MiniMind-3)
  data.py           corpus -> tokenizer -> the batches a step reads
  train.py          the one training loop, and where model and optimizer are built
  parallel.py       several ranks under torchrun: process group, batch shares, the wrapped model
  config.py         the experiment's configuration: one schema, one loader
  fingerprint.py    the settings a bit-exact continuation depends on
  checkpoint/       every save and load of a job's state, through one door (its modules: checkpoint/__init__)
  ablations.py      a resume that forgets (or re-derives) one piece, as buggy resume code does
  atomic.py         committing any file: whole or not at all, durable when the call returns
  preemption.py     a scheduler's stop signals, acted on after a step
  failpoint.py      fault injection for the tests
  hardware.py       the CPU's ISA flags
  export.py         weights for inference in transformers' layout
  report.py         report.md from the artifacts
  plots.py          the report's pictures
  errors.py         what a user can fix: one line, a non-zero exit
"""
