"""report.md (what the resume file holds, what leaving a piece out does, what half precision changes)
and summary.md, the same numbers as the README's results table."""

import argparse
import json
import os
from pathlib import Path

from mmkit.atomic import write_text_atomic
from mmkit.checkpoint import manager
from mmkit.errors import run_cli
from mmkit.report import read_divergence, render, render_dist, summary_table, tail_lines_equal


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--resume", required=True, help="resume file: its fingerprint holds the run's settings")
    p.add_argument("--divergence", required=True)
    p.add_argument("--fp16", required=True)
    p.add_argument("--bf16", required=True)
    p.add_argument("--optim", required=True)
    p.add_argument("--entries", required=True, help="resume_entries.md: the resume table, entry by entry")
    p.add_argument("--straight-log", required=True)
    p.add_argument("--resumed-log", required=True)
    p.add_argument("--plots", nargs=2, required=True, metavar=("LOSS_PNG", "GAP_PNG"))
    p.add_argument("--timing", nargs="+", required=True, help="timing/RUN.json of every training job")
    p.add_argument("--dist", help="dist/divergence.csv, when dist/ was built")
    p.add_argument("--out", required=True, help="report.md")
    p.add_argument("--summary", required=True, help="summary.md: the README's results table")
    args = p.parse_args()

    resume = manager.read(args.resume)
    fingerprint = resume["fingerprint"]
    optim = read_json(args.optim)
    timings = {Path(f).stem: read_json(f) for f in args.timing}
    timing = {job: t["train_seconds"] for job, t in timings.items()}
    longest = max(timing, key=timing.get)
    env = {
        # the settings as the resume file recorded them, so the report reads no config of its own
        **{k: fingerprint[k] for k in ("seed", "batch_size", "seq_len", "lr", "steps", "precision", "adamw", "model",
                                       "torch", "device", "threads", "accumulation_steps", "data_format")},
        "scaler": resume["scaler"],
        "cpu": timings[longest]["cpu"],  # the ISA flags of the machine that trained (mmkit.hardware)
        "stop_at": resume["step"],
        "params": optim["model_numel"],
        "jobs": len(timing), "train_seconds": sum(timing.values()),
        "longest_job": longest, "longest_seconds": timing[longest],
    }
    halves = {"fp16": read_json(args.fp16), "bf16": read_json(args.bf16)}
    divergence = read_divergence(args.divergence)
    log_match = tail_lines_equal(Path(args.straight_log).read_text(), Path(args.resumed_log).read_text())
    # the report links its pictures relative to itself, so the results folder can move as a whole
    plots = {k: os.path.relpath(v, Path(args.out).parent) for k, v in zip(("loss", "gap"), args.plots)}
    dist = read_divergence(args.dist) if args.dist else None
    entries = [line for line in Path(args.entries).read_text().splitlines() if line.startswith("|")]
    write_text_atomic(args.out, render(env, optim, halves, divergence, log_match, plots, entries)
                      + render_dist(dist, resume["step"]))
    write_text_atomic(args.summary, summary_table(env, optim, halves["fp16"], divergence))


def read_json(path):
    return json.loads(Path(path).read_text())


if __name__ == "__main__":
    run_cli(main)
