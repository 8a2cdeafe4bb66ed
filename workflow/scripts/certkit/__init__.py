"""certify's package: does a training command, killed and resumed, end where it would have ended uninterrupted?

  digest.py      raw-byte digests of tensors, batches and RNG states, fast enough to take every step
  recorder.py    loaded into an unmodified training process: a row per optimizer step, per rank; the kill
  site/          the sitecustomize that loads the recorder into every Python process of a command
  verdict.py     certificates compared: the first step, rank and piece that differ; verdict.json/.md/.svg
  runs.py        the command run straight, stopped by a real SIGKILL, and resumed

It knows nothing of the project around it (torch, numpy and the standard library only): the lab uses the
tool, never the other way round.
"""
