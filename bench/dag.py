"""d. The whole DAG's wall time against the training loops inside it: the rest is overhead."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import DIMS_SOURCES, ROOT


def dag_overhead(dims: str, cores: int) -> dict:
    """The DAG from a fresh copy of the workflow, at DIMS, timed whole, vs the training steps inside it.

    At --cores 1 the jobs run one after another, so wall - training = process starts, imports, data
    preparation, analysis jobs and snakemake itself. --cores 2 shows what running jobs side by side buys.
    """
    work = Path(tempfile.mkdtemp(prefix=".bench-dag-", dir=ROOT / "bench"))
    try:
        for name in ("Snakefile", "config.yaml", "environment.yml"):
            shutil.copy2(ROOT / name, work / name)
        shutil.copytree(ROOT / "workflow", work / "workflow", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(ROOT / "presets", work / "presets")
        overlay = [str(p.relative_to(ROOT)) for p in DIMS_SOURCES[dims]]
        (work / "bench.yaml").write_text("outdir: results\n")  # the preset's own outdir would do as well
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", str(cores), "all",
                               "--configfile", *overlay, "bench.yaml"], cwd=work, env=env, check=True,
                              capture_output=True, text=True)
        wall = time.perf_counter() - t0
        timing = {f.stem: yaml.safe_load(f.read_text()) for f in (work / "results" / "timing").glob("*.json")}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    train = sum(t["train_seconds"] for t in timing.values())
    steps = sum(t["last_step"] - t["first_step"] + 1 for t in timing.values())
    row = {"section": "dag", "what": f"snakemake --cores {cores}", "dims": dims, "cores": cores, "reps": 1,
           "median_ms": wall * 1000, "min_ms": wall * 1000, "iqr_pct": 0.0, "train_ms": train * 1000,
           "train_steps": steps, "jobs_training": len(timing), "overhead_ms": (wall - train) * 1000,
           "overhead_share": (wall - train) / train}
    # the jobs that are not training runs: where the overhead is, apart from each job's start
    row["other_jobs_s"] = " ".join(f"{rule}={sec}" for rule, sec in rule_seconds(proc.stdout + proc.stderr).items()
                                   if rule not in timing and sec)
    print(f"[dag] {dims} --cores {cores}: {wall:.1f} s wall, {train:.1f} s in {steps} training steps "
          f"({len(timing)} jobs): overhead {row['overhead_share'] * 100:.0f}% of training", flush=True)
    return row


def rule_seconds(log: str) -> dict:
    """{rule: seconds its jobs took}, from snakemake's log: a [timestamp] line before each job's start and
    each 'Finished jobid'. One-second resolution; exact as a sum only at --cores 1, where jobs do not overlap."""
    now, started, seconds = None, {}, {}
    rule = None
    for line in log.splitlines():
        if stamp := re.fullmatch(r"\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]", line.strip()):
            now = time.mktime(time.strptime(stamp[1], "%a %b %d %H:%M:%S %Y"))
        elif found := re.fullmatch(r"(?:local)?rule (\w+):", line.strip()):
            rule = found[1]
        elif (job := re.fullmatch(r"jobid: (\d+)", line.strip())) and rule:
            started[job[1]], rule = (rule, now), None
        elif (done := re.match(r"Finished jobid: (\d+)", line.strip())) and done[1] in started:
            name, t0 = started.pop(done[1])
            seconds[name] = seconds.get(name, 0) + round(now - t0)
    return dict(sorted(seconds.items(), key=lambda kv: -kv[1]))
