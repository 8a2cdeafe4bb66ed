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
import contextlib
import dataclasses
import json
import sys
import time

from mmkit.autoresume import CheckpointDir, Preemption

# first: from here on a SIGTERM/SIGUSR1 is noted, and acted on after a step, even one that arrives while
# torch is imported or the ranks join their process group (its default action ends the process unsaved)
PREEMPTION = Preemption()

from mmkit import store  # noqa: E402
from mmkit.atomic import write_text_atomic  # noqa: E402
from mmkit.checkpoint import save_atomic  # noqa: E402
from mmkit.config import load_config, run_config  # noqa: E402
from mmkit.data import StepPlan, TrainingData  # noqa: E402
from mmkit.errors import OneLineParser, Preempted, UserError, run_cli  # noqa: E402
from mmkit.failpoint import failpoint  # noqa: E402
from mmkit.hardware import cpu_vendor, isa_summary, resolve_precision  # noqa: E402
from mmkit.parallel import start, weights  # noqa: E402
from mmkit.resume import ABLATIONS, Expected  # noqa: E402
from mmkit.train import build, make_deterministic, train  # noqa: E402


def main():
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="config YAML: config.yaml, or a job's settings file")
    p.add_argument("--tokens", help="training tokens, 1-D integer .npy (data.format: windows)")
    p.add_argument("--jsonl", help='training documents, {"text": ...} per line (data.format: minimind)')
    p.add_argument("--tokenizer", help="tokenizer.json for --jsonl")
    p.add_argument("--out", required=True, help="weights file, or the resume file (directory under fsdp2) with --stop-at")
    p.add_argument("--loss-log", dest="log", help="CSV step,train_loss of the steps this run trains")
    p.add_argument("--stop-at", nargs="?", const="config", type=step_number,
                   help="stop after this step (alone: the config's stop_at) and write a resume file to --out")
    p.add_argument("--resume", help="continue from this resume file, or resume directory (.dcp)")
    for name, ablation in ABLATIONS.items():  # each throws away or re-derives entries of the resume
        p.add_argument(ablation.flag, dest=name, action="store_true", help=f"ablation: {ablation.help}")
    p.add_argument("--reshard", action="store_true", help="continue a resume saved at another world size")
    p.add_argument("--rank-generators", action="store_true",
                   help="ablation: each rank draws its own batches (seed + rank); a resume keeps rank 0's position")
    p.add_argument("--checkpoint-dir", help="this job's folder of periodic checkpoints (checkpoint.every); "
                   "a restart continues from the newest one of this run")
    p.add_argument("--timing", help="JSON with this run's steps and wall time")
    p.add_argument("--allow-mismatch", action="store_true", help="resume despite other settings (not bit-exact)")
    args = p.parse_args()
    args.ablations = [a for name, a in ABLATIONS.items() if getattr(args, name)]
    if (args.ablations or args.reshard) and not args.resume:
        raise UserError(", ".join(a.flag for a in ABLATIONS.values()) + " and --reshard only make sense with --resume")
    if args.minimind_rescale and not args.reshard:
        raise UserError("--minimind-rescale is a rule for resuming on another world size: add --reshard")

    settings = load_config(args.config)
    cfg = run_config(settings)
    stop_at = settings.stop_at if args.stop_at == "config" else args.stop_at
    if args.replay and cfg.data_format == "windows":
        raise UserError("--replay replays an epoch: it needs data.format minimind (the windows format has no "
                        "epochs; --no-skip rewinds it)")
    device = make_deterministic(cfg)
    if cfg.precision == "auto":  # decided here, once: the fingerprint, the timing and the report get the result
        cfg = dataclasses.replace(cfg, precision=resolve_precision(cfg.precision, device))
        print(f"precision: auto is {cfg.precision} on this {device} ({cpu_vendor()}: {isa_summary()})", file=sys.stderr,
              flush=True)
    ranks = start(cfg.parallel, device, args.rank_generators)
    try:
        run(args, cfg, stop_at, device, ranks)
    finally:
        ranks.close()


def run(args, cfg, stop_at, device, ranks):
    data = TrainingData(cfg, args.tokens, args.jsonl, args.tokenizer)
    live = build(cfg, device, ranks, data)
    plan = StepPlan(cfg.accumulation_steps, data.batches_per_epoch)
    expected = Expected(plan, cfg.seed, live.batches)
    last_step = cfg.steps if stop_at is None else stop_at
    if args.resume:
        store.resume(args.resume, live, expected, last_step, args.ablations, seed=cfg.seed,
                     allow_mismatch=args.allow_mismatch, reshard=args.reshard)
    # the ablations that shift the LR schedule or the data position keep shifting them after a restart
    # (both in micro-batches)
    schedule_offset = plan.consumed(live.step) if args.restart_schedule else 0
    expected.rewound_from(live.step, live.batches.position)

    checkpoints = CheckpointDir(args.checkpoint_dir, cfg.checkpoint) if args.checkpoint_dir else None
    if checkpoints:
        store.auto_resume(checkpoints, live, expected, last_step)
    first_step = live.step + 1
    if not first_step <= last_step <= cfg.steps:
        raise UserError(f"nothing to train: steps {first_step}..{last_step} of {cfg.steps}")

    def commit(pending):  # a checkpoint is whole once committed: only then may older ones go
        pending.commit()
        if ranks.main:
            checkpoints.prune()

    pending = None  # a checkpoint still being written in the background (checkpoint.async): one at most
    t0 = t_step = time.perf_counter()
    overlapped = False  # whether a background write was in flight when the step began (every: auto's measure)
    try:
        for step in train(cfg, device, live, plan, last_step, schedule_offset):
            failpoint(f"step{step}")  # the tests kill one rank here, mid-run
            if checkpoints and checkpoints.auto:
                checkpoints.auto.stepped(time.perf_counter() - t_step, overlapped)
            preempted = PREEMPTION.requested(ranks) and step < last_step
            if checkpoints and (preempted or due(checkpoints, step, last_step, ranks)):
                t_save = time.perf_counter()
                if pending:  # the next snapshot waits for the previous commit
                    commit(pending)
                path = checkpoints.new_path(step, ranks.sharded)
                in_background = cfg.checkpoint.async_save and not preempted
                pending = store.save(live, path, in_background)
                if not in_background:
                    commit(pending)
                    pending = None
                if ranks.main:
                    print(f"checkpoint: {path}{' (writing in the background)' if in_background else ''}",
                          file=sys.stderr, flush=True)
                if checkpoints.auto:
                    checkpoints.auto.saved(step, time.perf_counter() - t_save, pending)
            if preempted:  # its checkpoint was saved in the foreground and is committed
                raise Preempted(f"{PREEMPTION.received or 'a signal to another rank'} after step {step} of {last_step}: "
                                + (f"continue from {path}" if checkpoints else "no --checkpoint-dir, nothing saved"))
            t_step, overlapped = time.perf_counter(), pending is not None and pending.writing()
        seconds = time.perf_counter() - t0
        if pending:
            commit(pending)
            pending = None
    finally:
        if pending:  # a failed run lets its last checkpoint's write finish (atomic either way); its error first
            with contextlib.suppress(Exception):
                pending.wait()

    if stop_at is not None:
        store.save(live, args.out, in_background=cfg.checkpoint.async_save).commit()
    else:
        final = weights(live.model, ranks)
        if ranks.main:
            save_atomic(final, args.out)
        ranks.barrier()
    if ranks.main and args.log:
        write_text_atomic(args.log, "step,train_loss\n" + "".join(f"{s},{v:.6f}\n" for s, v in live.loss_log))
    if ranks.main and args.timing:
        timing = {"first_step": first_step, "last_step": last_step, "skipped_steps": live.skipped_steps,
                  "train_seconds": seconds, "world_size": ranks.world_size,
                  "threads": cfg.threads, "device": device, "precision": cfg.precision, "cpu": isa_summary()}
        write_text_atomic(args.timing, json.dumps(timing, indent=2) + "\n")
    if checkpoints and ranks.main:
        checkpoints.finish()


def due(checkpoints, step: int, last_step: int, ranks) -> bool:
    """A periodic checkpoint now? Under every: auto rank 0's clock decides for every rank."""
    if checkpoints.auto:
        return ranks.any(ranks.main and checkpoints.due(step, last_step))
    return checkpoints.due(step, last_step)


def step_number(text: str):
    return text if text == "config" else int(text)


if __name__ == "__main__":
    run_cli(main)
