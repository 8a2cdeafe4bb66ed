"""d. The whole DAG's wall time against the training loops inside it: the rest is overhead."""

import os
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
        subprocess.run([sys.executable, "-m", "snakemake", "--cores", str(cores), "--quiet", "all",
                        "--configfile", *overlay, "bench.yaml"], cwd=work, env=env, check=True, capture_output=True)
        wall = time.perf_counter() - t0
        timing = [yaml.safe_load(f.read_text()) for f in (work / "results" / "timing").glob("*.json")]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    train = sum(t["train_seconds"] for t in timing)
    steps = sum(t["last_step"] - t["first_step"] + 1 for t in timing)
    row = {"section": "dag", "what": f"snakemake --cores {cores}", "dims": dims, "cores": cores, "reps": 1,
           "median_ms": wall * 1000, "min_ms": wall * 1000, "iqr_pct": 0.0, "train_ms": train * 1000,
           "train_steps": steps, "jobs_training": len(timing), "overhead_ms": (wall - train) * 1000,
           "overhead_share": (wall - train) / train}
    print(f"[dag] {dims} --cores {cores}: {wall:.1f} s wall, {train:.1f} s in {steps} training steps "
          f"({len(timing)} jobs): overhead {row['overhead_share'] * 100:.0f}% of training", flush=True)
    return row
