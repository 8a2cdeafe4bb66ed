"""e. Peak resident memory of one MiniMind2-small training job (run.py in its own process, fp32).

Measured with os.wait4 on that one child, so nothing else the benchmark started counts. The second row
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
ALLOCATORS = {"glibc default": {}, "glibc, mmap threshold 128 KiB": {"MALLOC_MMAP_THRESHOLD_": "131072"}}


def peak_rss(dims: str, allocator: str, work: Path) -> dict:
    cfg = {**config_of(dims), "steps": STEPS, "stop_at": STEPS // 2, "precision": "fp32"}
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    tokens = np.random.default_rng(0).integers(0, cfg["model"]["vocab_size"], 200_000, dtype=np.uint16)
    np.save(work / "train.npy", tokens)
    cmd = [sys.executable, str(ROOT / "workflow" / "scripts" / "run.py"), "--config", str(work / "config.yaml"),
           "--tokens", str(work / "train.npy"), "--out", str(work / "w.pth"), "--timing", str(work / "t.json")]
    with open(work / "log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, env={**os.environ, **ALLOCATORS[allocator]})
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"the memory job failed: {(work / 'log').read_text()[-2000:]}")
    timing = json.loads((work / "t.json").read_text())
    row = {"section": "memory", "what": allocator, "dims": dims, "precision": "fp32", "threads": cfg["threads"],
           "peak_rss_mib": usage.ru_maxrss / 1024, "ms_per_step": 1000 * timing["train_seconds"] / STEPS}
    print(f"[memory] {dims} fp32, {allocator}: peak RSS {row['peak_rss_mib']:.0f} MiB, "
          f"{row['ms_per_step']:.0f} ms per step", flush=True)
    return row


def bench_memory(dims: str) -> list:
    with tempfile.TemporaryDirectory(prefix=".bench-mem-", dir=ROOT / "bench") as tmp:
        return [peak_rss(dims, allocator, Path(tmp)) for allocator in ALLOCATORS]
