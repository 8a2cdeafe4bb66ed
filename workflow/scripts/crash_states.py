"""The crash-state checker: every state a power loss may leave of each way this project saves, each continued from.

  crash_states.py --out-md results/crash/states.md --out-csv results/crash/states.csv
  crash_states.py --control no-file-fsync ...   # a negative control: passes only if it finds the failing
                                                # states it must (each save crashed until it has)

The saves, of a tiny model (the protocol is what is checked, and it is the same at any size: only the
number of writes grows), each recorded by certkit.crashstates and then crashed after every operation:
  file        resume.pth re-saved onto its own name (manager.save), continued with --resume
  dcp_resave  resume.dcp re-saved onto its own name: the directory swap, continued with --resume
  prune       a periodic checkpoint file committed and the older one pruned, then auto-resume
  async       the same, written in the background (checkpoint.async)
  dcp         a periodic DCP directory committed and the older one pruned, then auto-resume
  dcp_2ranks  the same by two processes (FSDP2 over gloo), their recordings merged in the order they were
              made; continued from what auto-resume reads (one process cannot load two ranks' state)
  rejected    a damaged checkpoint auto-resume skipped, removed once the run has committed its own
  finish      the job's end: its checkpoints removed (none must survive, none torn may be read)
In each state: the job continues from a complete checkpoint whose bytes are those committed, never a torn
one; a checkpoint reported committed is never lost; and nothing but a refusal (a UserError) escapes.

The controls break the protocol on purpose: each leaves some fsyncs out of what was recorded, and must fail
for its own reason (found in each save that commits):
  no-dir-fsync   the directory's, after a rename: a committed checkpoint is lost, its rename undone
  no-file-fsync  the data's (the directory is fsynced): the name persists, its bytes do not (torn)
  no-fsync       both, as MiniMind's lm_checkpoint saves (torch.save to .tmp, os.replace): lost and torn
"""

import argparse
import contextlib
import io
import os
import pickle
import re
import socket
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import get_state_dict

from mmkit.checkpoint import dcp, manager
from mmkit.atomic import write_text_atomic
from mmkit.checkpoint.folder import CheckpointConfig, CheckpointDir
from mmkit.config import RunConfig
from certkit.crashstates import MAX_CUTS, Recorder, coalesced, crash_states, merged, snapshot, write_tree
from mmkit.data import Expected, StepPlan, TrainingData
from mmkit.errors import UserError, run_cli
from mmkit.model import ModelConfig
from mmkit.parallel import ParallelConfig, start
from mmkit.train import build, make_deterministic, train

STEPS = 8
SAVES = ("file", "dcp_resave", "prune", "async", "dcp", "dcp_2ranks", "rejected", "finish")
RESAVED = {"file": "resume.pth", "dcp_resave": "resume.dcp"}  # continued with --resume of this name
FOLDER = {"finish": "checkpoints"}  # a checkpoint folder the job made, inside the recorded root
# a control: the fsyncs it leaves out, and the failures it must find in each save that commits
CONTROLS = {"no-dir-fsync": ({"fsync_dir"}, {"lost"}), "no-file-fsync": ({"fsync"}, {"torn"}),
            "no-fsync": ({"fsync", "fsync_dir"}, {"lost", "torn"})}
COMMITTING = tuple(s for s in SAVES if s != "finish")  # finish commits nothing a crash could lose
CFG = RunConfig(seed=0, batch_size=4, seq_len=16, lr=1e-3, steps=STEPS, accumulation_steps=1, threads=1,
                device="cpu", precision="fp32", adamw="foreach", nonfinite="stop", data_format="windows", workers=0,
                model=ModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                  vocab_size=256),
                parallel=ParallelConfig(), checkpoint=CheckpointConfig(every=2, keep=1))
TWO_RANKS = replace(CFG, parallel=ParallelConfig(world_size=2, strategy="fsdp2", backend="gloo"))


class Job:
    """One tiny training run, and a second live state that continues from whatever a crash left."""

    def __init__(self, tokens: Path, cfg: RunConfig = CFG):
        device = make_deterministic(cfg)
        self.data = TrainingData(cfg, tokens=tokens)
        self.ranks = start(cfg.parallel, device)
        self.live = build(cfg, device, self.ranks, self.data)
        self.plan = StepPlan(cfg.accumulation_steps, self.data.batches_per_epoch)
        self.steps = train(cfg, device, self.live, self.plan, STEPS)
        self.checker = build(cfg, device, self.ranks, self.data)
        self.expected = Expected(self.plan, cfg.seed, self.checker.batches, STEPS)

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
                    manager.resume(resume_file, self.checker, self.expected)
                except UserError:
                    return 0, ""
                return self.checker.step, resume_file.name
            found = manager.auto_resume(CheckpointDir(root, CFG.checkpoint), self.checker, self.expected)
        name = re.search(r"continuing from checkpoint \S*/(step_\d+\.\w+)", out.getvalue())
        return (self.checker.step, name.group(1)) if found else (0, "")


def read_back(root: Path) -> tuple[int, str]:
    """What auto-resume continues from in ROOT, read but not loaded (a checkpoint of two ranks): every
    interrupted swap and leftover dealt with as it does, then the newest checkpoint whose every file is
    present and unchanged."""
    folder = CheckpointDir(root, CFG.checkpoint)
    with contextlib.redirect_stderr(io.StringIO()):
        manager.tidy(folder)
    for path in folder.checkpoints():
        try:
            return manager.read(path)["step"], path.name
        except UserError:
            continue
    return 0, ""


# --- each save, recorded ---------------------------------------------------------------------------


def record(job: Job, root: Path, save: str) -> Recorder:
    """Run SAVE under ROOT (what comes before it made first, unrecorded), recording it."""
    root.mkdir(parents=True)
    folder = CheckpointDir(root / FOLDER.get(save, ""), CFG.checkpoint)
    sharded_dir = save in ("dcp", "dcp_resave")
    job.train_to(2)
    first = root / RESAVED[save] if save in RESAVED else folder.new_path(2, sharded_dir)
    write(job.live, first, sharded_dir)
    if save == "rejected":  # a checkpoint auto-resume refused: damaged
        damaged = root / "step_000003.pth"
        damaged.write_bytes(b"not a checkpoint")
        folder.reject(damaged)
    job.train_to(4)
    if save == "finish":
        write(job.live, folder.new_path(4, False), False)
        folder.prune()
    recorder = Recorder(root)
    with recorder:
        if save == "finish":
            folder.finish()
            return recorder
        path = root / RESAVED[save] if save in RESAVED else folder.new_path(4, sharded_dir)
        write(job.live, path, sharded_dir, in_background=save == "async")
        recorder.mark("step 4", path)
        if save not in RESAVED:
            folder.prune()
    return recorder


def write(live, path: Path, sharded_dir: bool, in_background: bool = False) -> None:
    if sharded_dir:  # in one process: the model and AdamW as FSDP2 keys them, the directory committed as there
        state = manager.entries.resume_state(live)
        state["model"], state["optimizer"] = get_state_dict(live.model, live.optimizer)
        dcp.save_resume_dir(state, path, live.ranks).commit()
    else:
        manager.save(live, path, in_background).commit()


def record_rank(tokens: Path, root: Path, out: Path) -> None:
    """One of dcp_2ranks' two processes: its checkpoints at steps 2 and 4, the second recorded; its
    recording to OUT."""
    job = Job(tokens, TWO_RANKS)
    folder = CheckpointDir(root, CFG.checkpoint)
    job.train_to(2)
    manager.save(job.live, folder.new_path(2, True)).commit()
    job.train_to(4)
    recorder = Recorder(root, inode_base=job.ranks.rank << 32)
    job.ranks.barrier()  # both have read the tree as it was before either writes
    with recorder:
        path = folder.new_path(4, True)
        manager.save(job.live, path).commit()
        if job.ranks.main:
            recorder.mark("step 4", path)
            folder.prune()
    job.ranks.barrier()
    out.write_bytes(pickle.dumps({"ops": recorder.ops, "initial": recorder.initial}))
    job.ranks.close()


def record_two_ranks(tokens: Path, root: Path) -> SimpleNamespace:
    """dcp_2ranks: two processes over gloo, each recording its own operations; merged in time."""
    root.mkdir(parents=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, "--rank-of-two", str(root), str(tokens),
                               str(root.parent / f"rank{rank}.ops")],
                              env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                   "WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    errors = [p.communicate()[1] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("error: a rank of dcp_2ranks failed:\n" + "\n".join(e[-2000:] for e in errors))
    # our own files, written a moment ago by this script's other two processes
    recordings = [pickle.loads((root.parent / f"rank{rank}.ops").read_bytes()) for rank in (0, 1)]
    initial = recordings[0]["initial"]
    return SimpleNamespace(ops=merged(initial, [r["ops"] for r in recordings]), initial=initial)


# --- each save, crashed ------------------------------------------------------------------------------


def failure(tree: dict, committed: dict, before: dict) -> str:
    """Why a state lost the newest committed checkpoint: torn if a file of it is on disk with bytes neither
    committed nor its previous version's (its data was not durable), else lost (its rename was undone)."""
    for path, data in committed.items():
        got = tree.get(path)
        if data is not None and got is not None and got != data and got != before.get(path):
            return "torn"
    return "lost"


def check(job, recorder, save: str, scratch: Path, must_find=(), cuts: int = MAX_CUTS) -> tuple[int, int, list]:
    """(crash points, states, [(kind, failure)]) of SAVE; with MUST_FIND, the kinds of failure a control must
    show: it stops once it has found one of each."""
    states, points, failures = 0, set(), []
    before = dict(recorder.initial)
    finals = [op.committed for op in recorder.ops if op.kind == "mark"]
    for k, marks, tree in crash_states(recorder, latest_first=bool(must_find), max_cuts=cuts):
        if must_find and set(must_find) <= {kind for kind, _ in failures}:
            break
        states += 1
        points.add(k)
        write_tree(tree, scratch)
        # complete versions: the earlier checkpoint and what this save writes (finished, if not yet reported)
        complete = [before] + finals
        newest = 0 if save == "finish" else 4 if marks else 2  # a checkpoint reported committed must not be lost
        try:
            if save == "dcp_2ranks":
                step, name = read_back(scratch)
            else:
                step, name = job.continued_from(scratch / FOLDER.get(save, ""),
                                                scratch / RESAVED[save] if save in RESAVED else None)
        except Exception as e:  # noqa: BLE001 -- a crash of the checker's job is what it reports
            failures.append(("crash", f"after operation {k}: crash: {type(e).__name__}: {str(e)[:120]}"))
            continue
        # what it continued from, as it is on disk after the start (which may have finished an interrupted swap)
        after = snapshot(scratch)
        if step < newest:
            kind = failure(tree, marks[-1].committed if marks else before, before)
            why = ("its bytes on disk are not those committed" if kind == "torn" else
                   "its name is gone or holds the previous version")
            failures.append((kind, f"after operation {k}: {kind}: continued from step {step}, but step {newest} "
                                   f"was committed ({why})"))
        elif step and not any(same_files(after, version, str(Path(FOLDER.get(save, ""), name)))
                              for version in complete):
            failures.append(("torn", f"after operation {k}: torn: continued from {name}, which is not a "
                                     "complete checkpoint"))
    return len(points), states, failures


def same_files(tree: dict, version: dict, name: str) -> bool:
    """Whether TREE holds checkpoint NAME (a file, or a directory's files) byte for byte as VERSION does."""
    ours = {p: v for p, v in tree.items() if p == name or p.startswith(name + "/")}
    theirs = {p: v for p, v in version.items() if p == name or p.startswith(name + "/")}
    return bool(ours) and ours == theirs


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-md", help="the report: states and failures per save")
    p.add_argument("--out-csv", help="save,control,operations,crash_points,states,failures,found")
    p.add_argument("--control", choices=list(CONTROLS), help="leave fsyncs out: must fail states, for its reason")
    p.add_argument("--controls", nargs="*", default=[], help="the controls' CSVs, for the report's table")
    p.add_argument("--cuts", type=int, default=MAX_CUTS, help=f"cut each write at this many lengths at most "
                   f"(default {MAX_CUTS}; fewer: faster, fewer torn states)")
    p.add_argument("--saves", nargs="+", choices=SAVES, default=SAVES, help="only these saves")
    p.add_argument("--rank-of-two", nargs=3, metavar=("ROOT", "TOKENS", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_of_two:
        root, tokens, out = map(Path, args.rank_of_two)
        return record_rank(tokens, root, out)
    if not (args.out_md and args.out_csv):
        p.error("the following arguments are required: --out-md, --out-csv")
    dropped, must_find = CONTROLS[args.control] if args.control else (set(), set())
    rows, lines = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokens = tmp / "tokens.npy"
        np.save(tokens, (np.arange(4096) * 7919 % CFG.model.vocab_size).astype(np.int32))
        for save in [s for s in (COMMITTING if args.control else SAVES) if s in args.saves]:
            job = Job(tokens)
            recorder = record_two_ranks(tokens, tmp / save) if save == "dcp_2ranks" else record(job, tmp / save, save)
            recorder.ops = [op for op in recorder.ops if op.kind not in dropped]
            points, states, failures = check(job, recorder, save, tmp / f"{save}.state", must_find, args.cuts)
            found = "+".join(sorted({kind for kind, _ in failures})) or "-"
            ops = len(coalesced(recorder.ops))  # writes that extend one another counted once, as they are crashed
            rows.append((save, args.control or "none", ops, points, states, len(failures), found))
            print(f"crash states: {save}: {ops} operations, {points} crash points, {states} "
                  f"states, {len(failures)} failing ({found})", file=sys.stderr, flush=True)
            lines += [f"- {save}: {f}" for _, f in failures[:3]]
    wrong = [r for r in rows if (r[5] if args.control is None else not must_find <= set(r[6].split("+")))]
    if wrong:
        what = ("failing states" if args.control is None else
                f"a control without the failures it must find ({'+'.join(sorted(must_find))})")
        raise SystemExit(f"error: the crash-state check found {what} in {', '.join(r[0] for r in wrong)}:\n"
                         + "\n".join(lines[:15]))
    header = "save,control,operations,crash_points,states,failures,found\n"
    write_text_atomic(args.out_csv, header + "".join(",".join(map(str, r)) + "\n" for r in rows))
    for path in args.controls:  # a control's row counts its states up to the failures it had to find
        rows += [tuple(line.split(",")) for line in Path(path).read_text().splitlines()[1:]]
    table = "\n".join(f"| {s} | {c} | {o} | {k} | {n} | {f} | {w} |" for s, c, o, k, n, f, w in rows)
    ours = [r for r in rows if r[1] == "none"]
    write_text_atomic(args.out_md, f"{sum(int(r[4]) for r in ours)} crash states of {len(ours)} saves, "
                      f"{sum(int(r[5]) for r in ours)} failing; each control (crashed until it has found the "
                      "failures it must: lost, a committed rename undone; torn, a committed name without its "
                      "bytes):\n\n| save | control | operations | crash points | states | failing | found |\n"
                      "|---|---|---|---|---|---|---|\n" + table + "\n" + "".join(f"\n{line}" for line in lines[:12])
                      + ("\n" if lines else ""))


if __name__ == "__main__":
    run_cli(main)
