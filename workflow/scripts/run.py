"""Train MiniMind: straight through, or stopped, or resumed with or without parts of the resume file.

  run.py --config C --tokens T --out straight.pth --loss-log straight_log.csv
  run.py --config C --tokens T --out resume.pth --stop-at 30            # OUT is then the resume file
  run.py --config C --tokens T --out resume.pth --stop-at               # ... stopped at the config's stop_at
  run.py --config C --tokens T --out resumed.pth --loss-log L --resume resume.pth [--no-optim|--no-skip|--restart-schedule]
  run.py --config C --jsonl train.jsonl --tokenizer tokenizer.json ...   # data.format: minimind

With --checkpoint-dir D the job also survives being killed: it checkpoints into D every checkpoint.every
steps and when SIGTERM/SIGUSR1 arrives (then exits 75), and the same command continues from there.
"""

import argparse
import json
import time

from mmkit.preemption import Preemption

# first: from here on a SIGTERM/SIGUSR1 is noted, and acted on after a step, even one that arrives while
# torch is imported or the ranks join their process group (its default action ends the process unsaved)
PREEMPTION = Preemption()

from mmkit.ablations import add_resume_flags, resume_options  # noqa: E402
from mmkit.atomic import write_text_atomic  # noqa: E402
from mmkit.checkpoint.manager import CheckpointManager  # noqa: E402
from mmkit.data import Expected, StepPlan, TrainingData  # noqa: E402
from mmkit.errors import OneLineParser, UserError, run_cli  # noqa: E402
from mmkit.failpoint import failpoint  # noqa: E402
from mmkit.hardware import isa_summary  # noqa: E402
from mmkit.parallel import start  # noqa: E402
from mmkit.train import build, configure, train  # noqa: E402


def parse_args(argv=None):
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="config YAML: config.yaml, or a job's settings file")
    p.add_argument("--tokens", help="training tokens, 1-D integer .npy (data.format: windows)")
    p.add_argument("--jsonl", help='training documents, {"text": ...} per line (data.format: minimind)')
    p.add_argument("--tokenizer", help="tokenizer.json for --jsonl")
    p.add_argument("--out", required=True, help="weights file, or the resume file (directory under fsdp2) with --stop-at")
    p.add_argument("--loss-log", dest="log", help="CSV step,train_loss of the steps this run trains")
    p.add_argument("--stop-at", nargs="?", const="config", type=lambda s: s if s == "config" else int(s),
                   help="stop after this step (alone: the config's stop_at) and write a resume file to --out")
    p.add_argument("--resume", help="continue from this resume file, or resume directory (.dcp)")
    add_resume_flags(p)  # the ablations, --reshard, --allow-mismatch
    p.add_argument("--rank-generators", action="store_true",
                   help="ablation: each rank draws its own batches (seed + rank); a resume keeps rank 0's position")
    p.add_argument("--checkpoint-dir", help="this job's folder of periodic checkpoints (checkpoint.every); "
                   "a restart continues from the newest one of this run")
    p.add_argument("--timing", help="JSON with this run's steps and wall time")
    args = p.parse_args(argv)
    args.options = resume_options(args)
    return args


def main():
    args = parse_args()
    cfg, stop_at, device = configure(args.config, args.stop_at, args.options)
    ranks = start(cfg.parallel, device, args.rank_generators)
    try:
        run(args, cfg, stop_at, device, ranks)
    finally:
        ranks.close()


def prepare(args, cfg, stop_at, device, ranks):
    """Up to the first step: the data, the model at step 0, then the --resume file and the newest checkpoint
    of this run checked and put in (tests call it)."""
    data = TrainingData(cfg, args.tokens, args.jsonl, args.tokenizer)
    live = build(cfg, device, ranks, data)
    plan = StepPlan(cfg.accumulation_steps, data.batches_per_epoch)
    last_step = cfg.steps if stop_at is None else stop_at
    expected = Expected(plan, cfg.seed, live.batches, last_step)
    checkpoints = CheckpointManager(live, cfg.checkpoint, args.checkpoint_dir, PREEMPTION)
    checkpoints.load(expected, args.resume, args.options)
    return live, plan, expected, last_step, checkpoints


def run(args, cfg, stop_at, device, ranks):
    live, plan, expected, last_step, checkpoints = prepare(args, cfg, stop_at, device, ranks)
    first_step = live.step + 1
    if not first_step <= last_step <= cfg.steps:
        raise UserError(f"nothing to train: steps {first_step}..{last_step} of {cfg.steps}")
    with checkpoints:
        t0 = time.perf_counter()
        for step in train(cfg, device, live, plan, last_step, expected.schedule_offset):
            failpoint(f"step{step}")  # the tests kill one rank here, mid-run
            checkpoints.after_step(step, last_step)
        seconds = time.perf_counter() - t0
        checkpoints.save(args.out, weights_only=stop_at is None)  # the resume file (--stop-at), or the weights
    if ranks.main and args.log:
        write_text_atomic(args.log, "step,train_loss\n" + "".join(f"{s},{v:.6f}\n" for s, v in live.loss_log))
    if ranks.main and args.timing:
        timing = {"first_step": first_step, "last_step": last_step, "skipped_steps": live.skipped_steps,
                  "train_seconds": seconds, "world_size": ranks.world_size,
                  "threads": cfg.threads, "device": device, "precision": cfg.precision, "cpu": isa_summary()}
        write_text_atomic(args.timing, json.dumps(timing, indent=2) + "\n")
    checkpoints.done()


if __name__ == "__main__":
    run_cli(main)
