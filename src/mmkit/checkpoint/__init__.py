"""mmkit.checkpoint: everything a training job saves and loads, through one door (manager.CheckpointManager).

Modules, by what they hold:
  manager.py  the door: CheckpointManager's load and save, for every path (a file or a DCP directory; in the
              foreground or the background; periodic, on a signal, final; --resume NAME and auto-resume),
              and the functions below it that the workflow's other scripts call
  entries.py  what a resume holds: the table of entries, each a piece of training state, and its seal
  files.py    the file format: torch files committed atomically, read back with weights_only, compared
  folder.py   a job's folder of checkpoints: where each goes, which are committed, which go
  dcp.py      the FSDP2 resume: a directory of DCP shards, committed whole
"""
