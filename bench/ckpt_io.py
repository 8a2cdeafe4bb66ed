"""c. Checkpoint I/O: save_atomic vs plain torch.save vs raw `dd conv=fsync` for a resume-file-sized dict,
and torch.load(weights_only=True) with and without mmap=True."""

import os
import re
import statistics
import subprocess
from pathlib import Path

import torch
from common import LR, model_config, paired_ratio, summary, time_interleaved, time_once

from mmkit.checkpoint.files import save_atomic
from mmkit.data import DataPosition
from mmkit.model import MiniMindForCausalLM
from mmkit.parallel import Ranks
from mmkit.checkpoint.entries import TrainingState, resume_state
from mmkit.train import WEIGHT_DECAY


def resume_sized_live(dims: str) -> TrainingState:
    """A live training state at DIMS with AdamW's state populated (exp_avg, exp_avg_sq): what a checkpoint
    after step 1 takes."""
    torch.manual_seed(0)
    model = MiniMindForCausalLM(model_config(dims))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3  # one AdamW step fills its state; the grad values do not matter
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    gen = torch.Generator().manual_seed(0)
    batches = DataPosition(gen, {"epoch": 0, "batch": 1})
    return TrainingState(model, optimizer, gen, batches, None, Ranks(1, 0, "single", 1),
                         {"format": 1, "note": "bench"}, step=1)


def resume_sized_state(dims: str) -> dict:
    """What run.py --stop-at writes: model + AdamW state + step + data position."""
    return resume_state(resume_sized_live(dims))


def dd_write(path: Path, mib: int) -> float:
    """Seconds dd reports for writing MIB MiB of zeros with conv=fsync (its own clock, not process start)."""
    out = subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", "conv=fsync"],
                         capture_output=True, text=True, check=True, env={**os.environ, "LC_ALL": "C"})
    m = re.search(r"copied, ([0-9.eE+-]+) s", out.stderr)
    if not m:
        raise RuntimeError(f"cannot parse dd's output: {out.stderr!r}")
    return float(m.group(1))


def fresh(path: Path):
    """Before each timed write: no old target, and no dirty pages of an earlier write left to flush."""
    path.unlink(missing_ok=True)
    Path(str(path) + ".tmp").unlink(missing_ok=True)
    os.sync()


def bench_saves(obj: dict, io_dir: Path, reps: int, warmup: int) -> tuple:
    atomic, plain, raw = io_dir / "atomic.pth", io_dir / "plain.pth", io_dir / "dd.bin"
    torch.save(obj, plain)
    size = plain.stat().st_size
    mib = max(1, round(size / 2**20))
    dd_seconds = []

    def run_atomic():
        fresh(atomic)
        return time_once(lambda: save_atomic(obj, atomic))

    def run_plain():
        fresh(plain)
        return time_once(lambda: torch.save(obj, plain))

    def run_dd():
        fresh(raw)
        dd_seconds.append(dd_write(raw, mib))

    # each candidate times itself after an untimed fresh(); time_interleaved's clock would include the sync
    own = {"save_atomic": [], "torch_save": []}
    runs = {"save_atomic": lambda: own["save_atomic"].append(run_atomic()),
            "torch_save": lambda: own["torch_save"].append(run_plain()),
            "dd_fsync": run_dd}
    time_interleaved(runs, reps, warmup)
    measured = {"save_atomic": own["save_atomic"][-reps:], "torch_save": own["torch_save"][-reps:],
                "dd_fsync": dd_seconds[-reps:]}
    mbs = {"save_atomic": size / 1e6, "torch_save": size / 1e6, "dd_fsync": mib * 2**20 / 1e6}
    dd_s_per_mb = statistics.median(measured["dd_fsync"]) / mbs["dd_fsync"]
    rows = []
    for what, t in measured.items():
        mb = mbs[what]
        row = {"section": "save", "what": what, "mb": mb, **summary(t), "mb_per_s": mb / statistics.median(t),
               "vs_torch_save": statistics.median(t) / statistics.median(measured["torch_save"]),
               "vs_torch_save_paired": paired_ratio(t, measured["torch_save"]),
               "vs_dd_fsync": statistics.median(t) / mb / dd_s_per_mb}  # per byte: dd writes whole MiB
        rows.append(row)
        print(f"[save] {what:>11}: {mb:.0f} MB in {row['median_ms']:.0f} ms ({row['mb_per_s']:.0f} MB/s), "
              f"/torch.save {row['vs_torch_save']:.2f}, /dd {row['vs_dd_fsync']:.2f}", flush=True)
    for p in (plain, raw):
        p.unlink(missing_ok=True)
    return rows, atomic


def read_all(obj) -> float:
    """Touch every byte of every tensor (what the first training step would do with the loaded state)."""
    if isinstance(obj, torch.Tensor):
        return float(obj.sum()) if obj.numel() else 0.0
    if isinstance(obj, dict):
        return sum(read_all(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(read_all(v) for v in obj)
    return 0.0


def bench_loads(path: Path, reps: int, warmup: int) -> list:
    mb = path.stat().st_size / 1e6

    def load(mmap: bool):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)

    runs = {"load": lambda: load(False), "load_mmap": lambda: load(True),
            "load+read": lambda: read_all(load(False)), "load_mmap+read": lambda: read_all(load(True))}
    times = time_interleaved(runs, reps, warmup)
    rows = []
    for what, t in times.items():
        base = "load+read" if what.endswith("+read") else "load"
        row = {"section": "load", "what": what, "mb": mb, **summary(t), "mb_per_s": mb / statistics.median(t),
               "vs_no_mmap": statistics.median(t) / statistics.median(times[base])}
        rows.append(row)
        print(f"[load] {what:>14}: {mb:.0f} MB in {row['median_ms']:.1f} ms, /no-mmap {row['vs_no_mmap']:.3f}",
              flush=True)
    return rows


def bench_checkpoint_io(dims: str, io_dir: Path, reps: int, warmup: int) -> list:
    torch.set_num_threads(1)  # as the workflow's training jobs (threads: 1); also spares I/O from a busy 2nd core
    obj = resume_sized_state(dims)
    print(f"[io] resume dict of the {dims} model, written in {io_dir}", flush=True)
    save_rows, atomic = bench_saves(obj, io_dir, reps, warmup)
    del obj
    load_rows = bench_loads(atomic, reps, warmup)
    atomic.unlink(missing_ok=True)
    for r in save_rows + load_rows:
        r["dims"] = dims
    return save_rows + load_rows
