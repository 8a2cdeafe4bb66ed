"""certify's package: does a training command, killed and resumed, end where it would have ended uninterrupted?

In three parts, as coverage.py's are (the part inside the measured process imports nothing of the other two):

in the program's process, loaded by site/ (torch, numpy, the standard library and each other only)
  site/          the sitecustomize that loads the recorder into every Python process of a command
  recorder.py    a row per optimizer step, per rank; the kill
  digest.py      raw-byte digests of tensors, batches and RNG states, fast enough to take every step
  watch.py       the program's saves (line, dtypes) and one step's draws from the global RNGs
  fileevents.py  certify --crash: every file event of a save, as it happens
  crashstates.py the file events of a save recorded; what a power loss may leave of them (also the lab's)

the orchestration: the runs, their processes and the out folder
  cli.py         the `certify` command (python -m certkit)
  runs.py        the command run straight, stopped by a real SIGKILL, and resumed
  lanes.py       the straight run beside the stopped and resumed runs, compared as they go, ended early
  saves.py       certify --crash: the stopped run's saves read back, every crash state rebuilt and resumed
  processes.py   every process a run starts ended and reaped with it (certify is their subreaper); signals
  outdir.py      the --out folder: its lock, the manifest of what certify wrote there, whole-or-nothing writes
  progress.py    what certify says on stderr while its runs go
  errors.py      CannotJudge (and its kinds StraightFailed, ResumeFailed) and Interrupted
  pytest_plugin.py  certify_resume: a project's own test, failing with the verdict's line

the judgement and its reports
  verdict.py     certificates compared: the first step, rank and piece that differ; verdict.json/.md/.svg
  diagnosis.py   why a resume is not exact, and where: each cause with its evidence, the user's line, the fix
  reports.py     the verdict for CI: JUnit XML (a testcase per rank), a Markdown step summary

It knows nothing of the project around it (torch, numpy and the standard library only): the lab uses the
tool, never the other way round.
"""

__version__ = "0.1.0"
