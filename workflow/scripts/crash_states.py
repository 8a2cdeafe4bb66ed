"""The crash-state checker: every state a power loss may leave of three saves, each one continued from.

  crash_states.py --out-md results/crash/states.md --out-csv results/crash/states.csv
  crash_states.py --control no-dir-fsync ...   # a negative control: passes only if it finds a failing state
                                               # (each save it breaks is crashed up to its first one)

The three saves, of a tiny model (the protocol is what is checked, and it is the same at any size: only
the number of writes grows), each recorded by mmkit.crashstates and then crashed after every operation:
  file   resume.pth rewritten (store.save), then continued with --resume (store.resume)
  dcp    a periodic DCP directory checkpoint committed and the older one pruned, then auto-resume
  prune  a periodic checkpoint file committed and the older one pruned, then auto-resume
In each state: the job continues from a complete checkpoint whose bytes are those committed, never a torn
one; a checkpoint reported committed is never lost; and nothing but a refusal (a UserError) escapes.

The controls break the protocol on purpose: no-dir-fsync leaves out the fsync of the directory after a
rename, no-fsync saves as MiniMind's lm_checkpoint does (torch.save to .tmp, os.replace, no fsync at all).
"""

import argparse
import contextlib
import io
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import get_state_dict

from mmkit import atomic, sharded, store
from mmkit.atomic import write_text_atomic
from mmkit.autoresume import CheckpointConfig, CheckpointDir
from mmkit.config import RunConfig
from mmkit.crashstates import Recorder, crash_states, snapshot, write_tree
from mmkit.data import StepPlan, TrainingData
from mmkit.errors import UserError, run_cli
from mmkit.model import ModelConfig
from mmkit.parallel import ParallelConfig, start
from mmkit.resume import Expected
from mmkit.train import build, make_deterministic, train

STEPS = 8
SEQUENCES = ("file", "dcp", "prune")
BREAKS = {"no-dir-fsync": SEQUENCES, "no-fsync": ("file", "prune")}  # the saves each control breaks (DCP
# fsyncs its own files)
CFG = RunConfig(seed=0, batch_size=4, seq_len=16, lr=1e-3, steps=STEPS, accumulation_steps=1, threads=1,
                device="cpu", precision="fp32", adamw="foreach", nonfinite="stop", data_format="windows", workers=0,
                model=ModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                  vocab_size=256),
                parallel=ParallelConfig(), checkpoint=CheckpointConfig(every=2, keep=1))


class Job:
    """One tiny training run, and a second live state that continues from whatever a crash left."""

    def __init__(self, tokens: Path):
        device = make_deterministic(CFG)
        self.data = TrainingData(CFG, tokens=tokens)
        ranks = start(CFG.parallel, device)
        self.live = build(CFG, device, ranks, self.data)
        self.plan = StepPlan(CFG.accumulation_steps, self.data.batches_per_epoch)
        self.steps = train(CFG, device, self.live, self.plan, STEPS)
        self.checker = build(CFG, device, ranks, self.data)
        self.expected = Expected(self.plan, CFG.seed, self.checker.batches)

    def train_to(self, step: int) -> None:
        while self.live.step < step:
            next(self.steps)

    def continued_from(self, root: Path, resume_file: Path | None) -> tuple[int, str]:
        """(the step continued from, the checkpoint's name) after auto-resume in ROOT, or --resume of
        RESUME_FILE; a refusal is (0, ''). Anything but a UserError escapes."""
        self.checker.step, out = 0, io.StringIO()
        with contextlib.redirect_stderr(out):
            if resume_file is not None:
                try:
                    store.resume(resume_file, self.checker, self.expected, STEPS, seed=CFG.seed)
                except UserError:
                    return 0, ""
                return self.checker.step, resume_file.name
            found = store.auto_resume(CheckpointDir(root, CFG.checkpoint), self.checker, self.expected, STEPS)
        name = re.search(r"continuing from checkpoint \S*/(step_\d+\.\w+)", out.getvalue())
        return (self.checker.step, name.group(1)) if found else (0, "")


def record(job: Job, root: Path, sequence: str) -> Recorder:
    """Run SEQUENCE's save under ROOT (its earlier checkpoint made first, unrecorded), recording it."""
    root.mkdir(parents=True)
    folder = CheckpointDir(root, CFG.checkpoint)
    sharded_dir = sequence == "dcp"
    job.train_to(2)
    first = root / "resume.pth" if sequence == "file" else folder.new_path(2, sharded_dir)
    save(job.live, first, sharded_dir)
    job.train_to(4)
    recorder = Recorder(root)
    with recorder:
        path = root / "resume.pth" if sequence == "file" else folder.new_path(4, sharded_dir)
        save(job.live, path, sharded_dir)
        recorder.mark("step 4", path)
        if sequence != "file":
            folder.prune()
    return recorder


def save(live, path: Path, sharded_dir: bool) -> None:
    if sharded_dir:  # in one process: the model and AdamW as FSDP2 keys them, the directory committed as there
        state = store.entries.resume_state(live)
        state["model"], state["optimizer"] = get_state_dict(live.model, live.optimizer)
        sharded.save_resume_dir(state, path, live.ranks).commit()
    else:
        store.save(live, path).commit()


def check(job: Job, recorder: Recorder, sequence: str, scratch: Path, first_failure=False) -> tuple[int, int, list[str]]:
    """(crash points, states, failures) of SEQUENCE; with FIRST_FAILURE, up to the first failing state (a
    control needs one)."""
    states, points, failures = 0, set(), []
    before = dict(recorder.initial)
    finals = [op.committed for op in recorder.ops if op.kind == "mark"]
    for k, marks, tree in crash_states(recorder, latest_first=first_failure):
        if first_failure and failures:
            break
        states += 1
        points.add(k)
        write_tree(tree, scratch)
        # complete versions: the earlier checkpoint and what this save writes (finished, if not yet reported)
        complete = [before] + finals
        newest = 4 if marks else 2  # a checkpoint reported committed by now must not be lost
        try:
            step, name = job.continued_from(scratch, scratch / "resume.pth" if sequence == "file" else None)
        except Exception as e:  # noqa: BLE001 -- a crash of the checker's job is what it reports
            failures.append(f"after operation {k}: {type(e).__name__}: {str(e)[:120]}")
            continue
        # what it continued from, as it is on disk after the start (which may have finished an interrupted swap)
        after = snapshot(scratch)
        if step < newest:
            failures.append(f"after operation {k}: continued from step {step}, but step {newest} was committed")
        elif not any(same_files(after, version, name) for version in complete):
            failures.append(f"after operation {k}: continued from {name}, which is not a complete checkpoint")
    return len(points), states, failures


def same_files(tree: dict, version: dict, name: str) -> bool:
    """Whether TREE holds checkpoint NAME (a file, or a directory's files) byte for byte as VERSION does."""
    ours = {p: v for p, v in tree.items() if p == name or p.startswith(name + "/")}
    theirs = {p: v for p, v in version.items() if p == name or p.startswith(name + "/")}
    return bool(ours) and ours == theirs


@contextlib.contextmanager
def broken(control: str | None):
    """The protocol as the control breaks it (restored afterwards)."""
    saved = (atomic.fsync_path, sharded.fsync_path, store.save_atomic)
    if control == "no-dir-fsync":
        def files_only(path, real=atomic.fsync_path):
            if not os.path.isdir(path):
                real(path)
        atomic.fsync_path = sharded.fsync_path = files_only
    elif control == "no-fsync":
        def replace_only(obj, path):  # MiniMind's lm_checkpoint: torch.save to .tmp, os.replace
            tmp = f"{path}.tmp"
            with open(tmp, "wb") as f:  # a file object, as write_atomic passes: the recorder sees Python's writes
                torch.save(obj, f)
            os.replace(tmp, path)
        store.save_atomic = replace_only
    try:
        yield
    finally:
        atomic.fsync_path, sharded.fsync_path, store.save_atomic = saved


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-md", required=True, help="the report: states and failures per save")
    p.add_argument("--out-csv", required=True, help="sequence,control,operations,crash_points,states,failures")
    p.add_argument("--control", choices=list(BREAKS), help="break the protocol: must fail states")
    p.add_argument("--controls", nargs="*", default=[], help="the controls' CSVs, for the report's table")
    p.add_argument("--sequences", nargs="+", choices=SEQUENCES, default=SEQUENCES, help="only these saves")
    args = p.parse_args()
    rows, lines = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokens = tmp / "tokens.npy"
        np.save(tokens, (np.arange(4096) * 7919 % CFG.model.vocab_size).astype(np.int32))
        for sequence in [s for s in BREAKS.get(args.control, SEQUENCES) if s in args.sequences]:
            job = Job(tokens)
            with broken(args.control):
                recorder = record(job, tmp / sequence, sequence)
            points, states, failures = check(job, recorder, sequence, tmp / f"{sequence}.state", bool(args.control))
            rows.append((sequence, args.control or "none", len(recorder.ops), points, states, len(failures)))
            print(f"crash states: {sequence}: {len(recorder.ops)} operations, {points} crash points, {states} "
                  f"states, {len(failures)} failing", file=sys.stderr, flush=True)
            lines += [f"- {sequence}: {f}" for f in failures[:5]]
    if any(r[-1] for r in rows) if args.control is None else not all(r[-1] for r in rows):
        what = "failing states" if args.control is None else "a control with no failing state"
        raise SystemExit(f"error: the crash-state check found {what}:\n" + "\n".join(lines[:15]))
    header = "sequence,control,operations,crash_points,states,failures\n"
    write_text_atomic(args.out_csv, header + "".join(",".join(map(str, r)) + "\n" for r in rows))
    for path in args.controls:  # a control's row counts its states up to the first failing one
        rows += [tuple(line.split(",")) for line in Path(path).read_text().splitlines()[1:]]
    table = "\n".join(f"| {s} | {c} | {o} | {k} | {n} | {f} |" for s, c, o, k, n, f in rows)
    total = sum(int(r[4]) for r in rows if r[1] == "none")
    write_text_atomic(args.out_md, f"{total} crash states of the three saves, {sum(int(r[5]) for r in rows if r[1] == 'none')} "
                      "failing; each control (a control stops at its first failing state):\n\n"
                      "| save | control | operations | crash points | states | failing |\n"
                      "|---|---|---|---|---|---|\n" + table + "\n" + "".join(f"\n{line}" for line in lines[:10])
                      + ("\n" if lines else ""))


if __name__ == "__main__":
    run_cli(main)
