"""certify's package: does a training command, killed and resumed, end where it would have ended uninterrupted?

  digest.py      raw-byte digests of tensors, batches and RNG states, fast enough to take every step
  recorder.py    loaded into an unmodified training process: a row per optimizer step, per rank; the kill
  watch.py       in the same process: the program's saves (line, dtypes) and one step's draws from the global RNGs
  site/          the sitecustomize that loads the recorder into every Python process of a command
  verdict.py     certificates compared: the first step, rank and piece that differ; verdict.json/.md/.svg
  diagnosis.py   why a resume is not exact, and where: each cause with its evidence, the user's line, the fix
  runs.py        the command run straight, stopped by a real SIGKILL, and resumed
  processes.py   every process a run starts ended and reaped with it (certify is their subreaper); signals
  outdir.py      the --out folder: its lock, the manifest of what certify wrote there, whole-or-nothing writes
  progress.py    what certify says on stderr while its runs go
  errors.py      CannotJudge (and its kinds StraightFailed, ResumeFailed) and Interrupted
  cli.py         the `certify` command (python -m certkit)
  reports.py     the verdict for CI: JUnit XML (a testcase per rank), a Markdown step summary
  pytest_plugin.py  certify_resume: a project's own test, failing with the verdict's line
  crashstates.py the file events of a save recorded; what a power loss may leave of them (also the lab's)
  saves.py       certify --crash: the stopped run's saves recorded, every crash state rebuilt and resumed

It knows nothing of the project around it (torch, numpy and the standard library only): the lab uses the
tool, never the other way round.
"""

__version__ = "0.1.0"
