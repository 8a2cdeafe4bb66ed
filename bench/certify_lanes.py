"""j. certify's wall time ÷ the straight run alone: lanes_loop.py (the default config's model, 1 thread) sized
to at least MIN_SECONDS, run by itself and under certify, one after another in this same run; exact (the
resume kept) and not exact (the batch generator forgotten, K = half the steps), with certify's default lanes
and with --jobs 1 (the runs one after another).
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT

MIN_SECONDS = 20.0
LOOP = ROOT / "bench" / "lanes_loop.py"
CERTIFY = [sys.executable, "-m", "certkit"]


def _timed(argv: list, env: dict) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode not in (0, 1):  # certify's 1: not exact, as asked
        raise RuntimeError(f"{argv[:4]}...: exit {proc.returncode}: {proc.stderr[-1000:]}")
    return seconds


def bench_certify_lanes() -> list:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix=".bench-lanes-") as work:
        work = Path(work)

        def straight(steps: int) -> float:
            return _timed([sys.executable, LOOP, "--out", work / "alone", "--steps", str(steps),
                           "--save-every", str(steps // 2)], env)

        steps = 20
        while (seconds := straight(steps)) < MIN_SECONDS:  # sized here: the machine sets a step's time
            steps = int(steps * min(4.0, 1.15 * MIN_SECONDS / seconds)) // 2 * 2
        print(f"certify lanes: lanes_loop.py, {steps} steps: {seconds:.1f} s alone", file=sys.stderr, flush=True)
        command = [sys.executable, LOOP, "--out", "{run}", "--steps", str(steps), "--save-every", str(steps // 2)]
        rows, alone = [], [seconds]
        for verdict, forget in (("exact", ""), ("not exact", " --forget generator")):
            for jobs in ([], ["--jobs", "1"]):
                out = work / f"{verdict}{len(jobs)}"
                wall = _timed([*CERTIFY, "--out", out, "--stop-after", str(steps // 2),
                               f"--resume=--resume {{run}}/step_{{step}}.pt{forget}", *jobs, "--", *command], env)
                alone.append(straight(steps))  # the straight run alone again, beside each: a noisy machine
                rows.append({"section": "lanes", "what": verdict, "jobs": "--jobs 1" if jobs else "default",
                             "steps": steps, "certify_s": wall, "alone_s": (alone[-2] + alone[-1]) / 2,
                             "vs_alone": wall / ((alone[-2] + alone[-1]) / 2)})
                print(f"certify lanes: {verdict}, jobs {rows[-1]['jobs']}: {wall:.1f} s, "
                      f"÷ alone {rows[-1]['vs_alone']:.2f}", file=sys.stderr, flush=True)
    return rows
