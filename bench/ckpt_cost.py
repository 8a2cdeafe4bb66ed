"""h. What a checkpoint costs the run: the stall per save (sync vs checkpoint.async), training time with
checkpoints every 10 steps and with every: auto against none, recovery after a SIGKILL, and preemption latency.

Every training run is run.py in its own process at MiniMind2-small's dims, 1 thread, on random tokens; its
train_seconds (the loop, checkpoints included, not the process start) comes from its --timing file.
"""

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from ckpt_io import resume_sized_live
from common import ROOT, config_of, summary, time_interleaved

from mmkit.checkpoint import manager

RUN = ROOT / "workflow" / "scripts" / "run.py"
EVERY = 10


def bench_stall(dims: str, io_dir: Path, reps: int, warmup: int) -> dict:
    """How long save() holds the loop: the whole durable write (sync), or the snapshot (async; the write
    goes on in a thread, committed before the next round)."""
    torch.set_num_threads(1)
    live = resume_sized_live(dims)
    path = io_dir / "stall.pth"
    committed, buffers = [], []  # async: each snapshot refills the last one's host storages, as run.py's do

    def sync():
        manager.save(live, path).commit()

    def async_():
        pending = manager.save(live, path, in_background=True, buffers=buffers)
        async_.pending = pending

    def async_then_commit():
        async_()
        t0 = time.perf_counter()
        async_.pending.commit()
        committed.append(time.perf_counter() - t0)

    times = time_interleaved({"sync": sync, "async": async_then_commit}, reps, warmup, label="stall")
    # async's own figure is save() alone: time it again, each after the previous commit
    blocked = []
    for _ in range(reps):
        t0 = time.perf_counter()
        async_()
        blocked.append(time.perf_counter() - t0)
        async_.pending.commit()
    mb = path.stat().st_size / 1e6
    path.unlink()
    row = {"section": "cost", "what": "stall per save", "dims": dims, "mb": mb,
           "sync_ms": statistics.median(times["sync"]) * 1e3, "async_ms": statistics.median(blocked) * 1e3,
           "async_commit_ms": statistics.median(committed) * 1e3, **summary(blocked)}
    row["async_vs_sync"] = row["async_ms"] / row["sync_ms"]
    print(f"[cost] stall per save, {mb:.0f} MB: sync {row['sync_ms']:.0f} ms, async {row['async_ms']:.0f} ms "
          f"(÷ sync {row['async_vs_sync']:.3f}; its write then took {row['async_commit_ms']:.0f} ms more)", flush=True)
    return row


def job_config(work: Path, dims: str, steps: int, **checkpoint) -> Path:
    cfg = config_of(dims)
    cfg.update(steps=steps, stop_at=steps // 2, threads=1)
    cfg["checkpoint"] = {**cfg["checkpoint"], "keep": 2, "keep_when_done": False, **checkpoint}
    path = work / f"{'-'.join(f'{k}{v}' for k, v in checkpoint.items()) or 'none'}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def tokens_file(work: Path, dims: str) -> Path:
    path = work / "tokens.npy"
    vocab = config_of(dims)["model"]["vocab_size"]
    np.save(path, np.random.default_rng(0).integers(0, vocab, 400_000, dtype=np.int32))
    return path


def run_job(config: Path, tokens: Path, work: Path, checkpoints: bool = True, signal_after: int | None = None):
    """run.py on CONFIG: (train_seconds, stderr, {event: seconds since start}); SIGNAL_AFTER: SIGTERM once that
    step's line is out, timing the committed checkpoint and the exit."""
    out, timing = work / "out.pth", work / "timing.json"
    timing.unlink(missing_ok=True)
    cmd = [sys.executable, str(RUN), "--config", str(config), "--tokens", str(tokens), "--out", str(out),
           "--timing", str(timing)] + (["--checkpoint-dir", str(work / "ck")] if checkpoints else [])
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines, events = [], {}
    for line in proc.stderr:
        now = time.perf_counter() - t0
        lines.append(line)
        if signal_after is not None and line.startswith(f"step {signal_after:>4}/") and "signal" not in events:
            proc.send_signal(signal.SIGTERM)
            events["signal"] = now
        if line.startswith("resume: continuing from checkpoint"):
            events["resumed"] = now
        if line.startswith("step ") and "first step" not in events:
            events["first step"] = now
            events["first step ms"] = float(re.search(r"(\d+) ms", line).group(1))
        if line.startswith("checkpoint: ") and "signal" in events:
            events["committed after signal"] = now
    code = proc.wait()
    events["exit"] = time.perf_counter() - t0
    err = "".join(lines)
    if code not in (0, 75):
        raise RuntimeError(f"run.py exited {code}:\n{err[-2000:]}")
    seconds = json.loads(timing.read_text())["train_seconds"] if code == 0 else None
    return seconds, err, events


def bench_training(dims: str, work: Path, rounds: int) -> list:
    """Training time with a checkpoint every 10 steps (sync, async) and with every: auto, each ÷ none."""
    steps = 2 * EVERY + 1  # two checkpoints, at 10 and 20 (none after the last step: the output follows)
    tokens = tokens_file(work, dims)
    configs = {"none": job_config(work, dims, steps, every=0),
               "sync": job_config(work, dims, steps, every=EVERY, **{"async": False}),
               "async": job_config(work, dims, steps, every=EVERY, **{"async": True}),
               "auto": job_config(work, dims, steps, every="auto", overhead=0.02, **{"async": True})}
    seconds = {name: [] for name in configs}
    intervals = []
    for r in range(rounds):
        for name in (list(configs) if r % 2 == 0 else list(configs)[::-1]):
            t, err, _ = run_job(configs[name], tokens, work, checkpoints=name != "none")
            seconds[name].append(t)
            intervals += re.findall(r"every auto = (\d+) steps", err) if name == "auto" else []
            print(f"    [cost] round {r + 1}/{rounds} {name}: {t:.2f} s of training", flush=True)
    rows = []
    for name in ("sync", "async", "auto"):
        ratio = statistics.median(seconds[name]) / statistics.median(seconds["none"])
        rows.append({"section": "cost", "what": f"training time, checkpoints {name}", "dims": dims, "steps": steps,
                     "seconds": statistics.median(seconds[name]), "none_seconds": statistics.median(seconds["none"]),
                     "vs_none": ratio, "overhead": ratio - 1,
                     "auto_every": ",".join(dict.fromkeys(intervals)) if name == "auto" else ""})
        print(f"[cost] {steps} steps with checkpoints {name} ÷ none: {ratio:.3f}"
              + (f" (auto chose every {rows[-1]['auto_every']})" if name == "auto" else ""), flush=True)
    return rows


def bench_recovery(dims: str, work: Path) -> dict:
    """SIGKILL after a committed checkpoint, then the same command: from its start to the end of its first
    step, split into process start and imports, reading the checkpoint, checking and restoring it, the step."""
    tokens = work / "tokens.npy"
    config = job_config(work, dims, 3 * EVERY, every=EVERY, **{"async": False})
    checkpoints = work / "ck"
    subprocess.run(["rm", "-rf", str(checkpoints)], check=True)
    proc = subprocess.Popen([sys.executable, str(RUN), "--config", str(config), "--tokens", str(tokens), "--out",
                             str(work / "out.pth"), "--checkpoint-dir", str(checkpoints)], stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    for line in proc.stderr:  # a sync checkpoint's line is printed once it is committed
        if line.startswith("checkpoint: "):
            proc.kill()
            break
    proc.wait()
    t0 = time.perf_counter()
    load = (f"import importlib.util as u; s = u.spec_from_file_location('run', {str(RUN)!r}); "
            "s.loader.exec_module(u.module_from_spec(s))")  # run.py imported, not run: its imports alone
    subprocess.run([sys.executable, "-c", load],
                   check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    imports = time.perf_counter() - t0
    newest = sorted(checkpoints.glob("step_*.pth"))[-1]
    build, read, resume = resume_in_process(config, tokens, checkpoints, newest)
    _, err, events = run_job(config, tokens, work, signal_after=EVERY + 1)  # ends at once after its first step
    total, step = events["first step"], events["first step ms"] / 1e3
    row = {"section": "cost", "what": "recovery", "dims": dims, "total_s": total, "imports_s": imports,
           "build_s": build, "read_s": read, "checks_s": resume - read, "first_step_s": total - events["resumed"],
           "step_s": step, "vs_step_plus_start": total / (step + imports)}
    print(f"[cost] recovery: {total:.2f} s from the restart to the end of its first step; measured apart: start "
          f"and imports {imports:.2f}, model, optimizer and data built {build:.2f}, reading {newest.name} "
          f"{read:.2f}, checking and restoring it {resume - read:.2f}, the step {row['first_step_s']:.2f}; "
          f"÷ (one step + one process start) {row['vs_step_plus_start']:.2f}", flush=True)
    return row


def resume_in_process(config: Path, tokens: Path, checkpoints: Path, newest: Path) -> tuple:
    """(build, read, auto-resume) seconds, as run.py does them: the model, AdamW and data built, the newest
    checkpoint read, then auto-resume (read again, every entry checked, put back)."""
    from mmkit.config import load_config, run_config
    from mmkit.data import Expected, StepPlan, TrainingData
    from mmkit.parallel import start
    from mmkit.train import build, make_deterministic

    cfg = run_config(load_config(config))
    device = make_deterministic(cfg)
    t0 = time.perf_counter()
    data = TrainingData(cfg, str(tokens), None, None)
    live = build(cfg, device, start(cfg.parallel, device, False), data)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    manager.read(newest)
    read = time.perf_counter() - t0
    expected = Expected(StepPlan(cfg.accumulation_steps, data.batches_per_epoch), cfg.seed, live.batches,
                        cfg.steps)
    t0 = time.perf_counter()
    manager.CheckpointManager(live, cfg.checkpoint, checkpoints).load(expected)  # run.py's one load
    return built, read, time.perf_counter() - t0


def bench_preemption(dims: str, work: Path, step_s: float, save_s: float) -> list:
    """SIGTERM mid-run: how long until its checkpoint is committed, sync and async (limit: a step and a save)."""
    tokens = work / "tokens.npy"
    rows = []
    for mode in (False, True):
        config = job_config(work, dims, 3 * EVERY, every=EVERY, **{"async": mode})
        subprocess.run(["rm", "-rf", str(work / "ck")], check=True)
        _, err, events = run_job(config, tokens, work, signal_after=EVERY + 2)
        latency = events["committed after signal"] - events["signal"]
        rows.append({"section": "cost", "what": f"preemption latency, {'async' if mode else 'sync'}", "dims": dims,
                     "latency_s": latency, "limit_s": step_s + save_s, "vs_limit": latency / (step_s + save_s)})
        print(f"[cost] preemption, {'async' if mode else 'sync'}: SIGTERM to a committed checkpoint {latency:.2f} s "
              f"(one step + one save: {step_s + save_s:.2f} s)", flush=True)
    return rows


def bench_checkpoint_cost(dims: str, work: Path, reps: int, warmup: int, rounds: int) -> list:
    stall = bench_stall(dims, work, reps, warmup)
    rows = [stall] + bench_training(dims, work, rounds)
    recovery = bench_recovery(dims, work)
    rows += [recovery] + bench_preemption(dims, work, recovery["step_s"], stall["sync_ms"] / 1e3)
    return rows
