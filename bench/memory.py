"""e. Peak resident memory of one MiniMind2-small training job (run.py in its own process, fp32).

Measured as the child's own VmHWM at exit (/proc/self/status, the kernel's count for that process's
memory, reset by exec, unlike getrusage's ru_maxrss, which a child keeps from the benchmark process it
was forked from), so nothing else the benchmark holds or started counts. The second row
runs the same job with glibc's mmap threshold pinned at 128 KiB: every large tensor is then mapped and
unmapped, nothing is kept on the heap, which shows how much of the peak is the allocator's retention
and what giving it back costs per step.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml
from common import ROOT, config_of

STEPS = 4  # the peak is reached in step 2, once AdamW's state exists next to a step's activations
# run.py as __main__, reporting its peak resident memory in kB to the file named first, once it exits
MEASURED = """import atexit, runpy, sys
out, sys.argv = sys.argv[1], sys.argv[2:]
def peak():
    with open("/proc/self/status") as f, open(out, "w") as o:
        o.write(next(line for line in f if line.startswith("VmHWM:")).split()[1])
atexit.register(peak)
runpy.run_path(sys.argv[0], run_name="__main__")
"""
ALLOCATORS = {"glibc default": {}, "glibc, mmap threshold 128 KiB": {"MALLOC_MMAP_THRESHOLD_": "131072"}}


def peak_rss(dims: str, allocator: str, work: Path) -> dict:
    cfg = {**config_of(dims), "steps": STEPS, "stop_at": STEPS // 2, "precision": "fp32"}
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    tokens = np.random.default_rng(0).integers(0, cfg["model"]["vocab_size"], 200_000, dtype=np.uint16)
    np.save(work / "train.npy", tokens)
    cmd = [sys.executable, "-c", MEASURED, str(work / "peak_kb"), str(ROOT / "workflow" / "scripts" / "run.py"),
           "--config", str(work / "config.yaml"),
           "--tokens", str(work / "train.npy"), "--out", str(work / "w.pth"), "--timing", str(work / "t.json")]
    with open(work / "log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=log, env={**os.environ, **ALLOCATORS[allocator]})
    if proc.returncode != 0:
        raise RuntimeError(f"the memory job failed: {(work / 'log').read_text()[-2000:]}")
    timing = json.loads((work / "t.json").read_text())
    row = {"section": "memory", "what": allocator, "dims": dims, "precision": "fp32", "threads": cfg["threads"],
           "peak_rss_mib": int((work / "peak_kb").read_text()) / 1024, "ms_per_step": 1000 * timing["train_seconds"] / STEPS}
    print(f"[memory] {dims} fp32, {allocator}: peak RSS {row['peak_rss_mib']:.0f} MiB, "
          f"{row['ms_per_step']:.0f} ms per step", flush=True)
    return row


def bench_memory(dims: str) -> list:
    with tempfile.TemporaryDirectory(prefix=".bench-mem-", dir=ROOT / "bench") as tmp:
        return [peak_rss(dims, allocator, Path(tmp)) for allocator in ALLOCATORS]
