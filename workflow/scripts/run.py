"""Train MiniMind: straight through, or stopped, or resumed with or without parts of the resume file.

  run.py --config C --tokens T --out straight.pth --loss-log straight_log.csv
  run.py --config C --tokens T --out resume.pth --stop-at 30            # OUT is then the resume file
  run.py --config C --tokens T --out resume.pth --stop-at               # ... stopped at the config's stop_at
  run.py --config C --tokens T --out resumed.pth --loss-log L --resume resume.pth [--no-optim|--no-skip|--restart-schedule]

With --checkpoint-dir D the job also survives being killed: it checkpoints into D every checkpoint.every
steps and when SIGTERM/SIGUSR1 arrives (then exits 75), and the same command continues from there.
"""

import argparse
import json
import sys
import time
from pathlib import Path

from mmkit.atomic import sha256_file, write_text_atomic
from mmkit.autoresume import CheckpointDir, Preemption
from mmkit.checkpoint import check_fingerprint, check_resume, read_resume, resume_state, save_atomic, save_resume_file
from mmkit.config import load_config, run_config
from mmkit.data import generator_at, load_tokens
from mmkit.errors import Preempted, UserError, run_cli
from mmkit.failpoint import failpoint
from mmkit.parallel import start, state_dicts, unwrap, weights
from mmkit.train import build, fingerprint, make_deterministic, train


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="config YAML: config.yaml, or a job's settings file")
    p.add_argument("--tokens", required=True, help="training tokens, 1-D integer .npy")
    p.add_argument("--out", required=True, help="weights file, or the resume file (directory under fsdp2) with --stop-at")
    p.add_argument("--loss-log", dest="log", help="CSV step,train_loss of the steps this run trains")
    p.add_argument("--stop-at", nargs="?", const="config", type=step_number,
                   help="stop after this step (alone: the config's stop_at) and write a resume file to --out")
    p.add_argument("--resume", help="continue from this resume file, or resume directory (.dcp)")
    p.add_argument("--no-optim", action="store_true", help="ablation: start AdamW afresh on resume")
    p.add_argument("--no-skip", action="store_true", help="ablation: re-seed the batch generator on resume")
    p.add_argument("--restart-schedule", action="store_true", help="ablation: count the LR schedule from 0 on resume")
    p.add_argument("--reshard", action="store_true", help="continue a resume saved at another world size")
    p.add_argument("--rank-generators", action="store_true",
                   help="ablation: each rank draws its own batches (seed + rank); a resume keeps rank 0's position")
    p.add_argument("--minimind-rescale", action="store_true",
                   help="ablation, with --reshard: MiniMind's step * saved_ws // current_ws, data order re-derived")
    p.add_argument("--checkpoint-dir", help="this job's folder of periodic checkpoints (checkpoint.every); "
                   "a restart continues from the newest one of this run")
    p.add_argument("--timing", help="JSON with this run's steps and wall time")
    p.add_argument("--allow-mismatch", action="store_true", help="resume despite other settings (not bit-exact)")
    args = p.parse_args()
    if (args.no_optim or args.no_skip or args.restart_schedule or args.reshard) and not args.resume:
        raise UserError("--no-optim, --no-skip, --restart-schedule and --reshard only make sense with --resume")
    if args.minimind_rescale and not args.reshard:
        raise UserError("--minimind-rescale is a rule for resuming on another world size: add --reshard")

    settings = load_config(args.config)
    cfg = run_config(settings)
    stop_at = settings.stop_at if args.stop_at == "config" else args.stop_at
    device = make_deterministic(cfg)
    ranks = start(cfg.parallel, device, args.rank_generators)
    try:
        run(args, cfg, stop_at, device, ranks)
    finally:
        ranks.close()


def run(args, cfg, stop_at, device, ranks):
    preemption = Preemption()  # from here on a SIGTERM/SIGUSR1 is noted, and acted on after a step
    tokens = load_tokens(args.tokens, cfg.model.vocab_size, cfg.seq_len + 2, "training tokens")
    model, optimizer, batch_generator = build(cfg, device, ranks)
    fp = fingerprint(cfg, device, tokens, ranks)
    drawn = cfg.batch_size // ranks.world_size if ranks.rank_generators else cfg.batch_size

    def gen_state_at(batches):  # the data position after this many batches of this run
        return generator_at(cfg.seed, batches, len(tokens), drawn, cfg.seq_len).get_state()

    last_step = cfg.steps if stop_at is None else stop_at
    first_step, skipped_steps, loss_log = 1, 0, []
    origin = {"resume_sha256": None, "ablations": []}
    if args.resume:
        first_step, skipped_steps = resume(args, cfg, fp, ranks, model, optimizer, batch_generator, gen_state_at,
                                           last_step)
        origin = {"resume_sha256": resume_sha256(args.resume), "ablations": ablations(args)}
    # the ablations that shift the LR schedule or the data position keep shifting them after a restart
    schedule_offset = first_step - 1 if args.restart_schedule else 0
    data_lag = first_step - 1 if args.no_skip else 0

    checkpoints = CheckpointDir(args.checkpoint_dir, cfg.checkpoint) if args.checkpoint_dir else None
    if checkpoints:
        found = auto_resume(checkpoints, fp, origin, ranks, model, optimizer, batch_generator,
                            lambda step: gen_state_at(step - data_lag), last_step)
        if found:
            first_step, skipped_steps, loss_log = found

    if not first_step <= last_step <= cfg.steps:
        raise UserError(f"nothing to train: steps {first_step}..{last_step} of {cfg.steps}")

    def state_now(step):
        return resume_state(*state_dicts(model, optimizer, ranks), step, skipped_steps, batch_generator, fp, origin,
                            list(loss_log))

    def commit(pending):  # a checkpoint is whole once committed: only then may older ones go
        pending.commit()
        if ranks.main:
            checkpoints.prune()

    pending = None  # a checkpoint still being written in the background (checkpoint.async)
    t0 = time.perf_counter()
    for step, loss, skipped in train(cfg, device, model, optimizer, batch_generator, tokens, first_step, last_step,
                                     ranks, schedule_offset):
        loss_log.append((step, loss))
        skipped_steps += skipped
        failpoint(f"step{step}")  # the tests kill one rank here, mid-run
        preempted = preemption.requested(ranks) and step < last_step
        if checkpoints and (preempted or checkpoints.due(step, last_step)):
            if pending:
                commit(pending)
            path = checkpoints.new_path(step, ranks.sharded)
            in_background = cfg.checkpoint.async_save and not preempted
            pending = save_resume(state_now(step), path, ranks, in_background)
            if not in_background:
                commit(pending)
                pending = None
            if ranks.main:
                print(f"checkpoint: {path}", file=sys.stderr, flush=True)
        if preempted:  # its checkpoint was saved in the foreground and is committed
            raise Preempted(f"{preemption.received or 'a signal to another rank'} after step {step} of {last_step}: "
                            + (f"continue from {path}" if checkpoints else "no --checkpoint-dir, nothing saved"))
    seconds = time.perf_counter() - t0
    if pending:
        commit(pending)

    if stop_at is not None:
        save_resume(state_now(last_step), args.out, ranks, cfg.checkpoint.async_save).commit()
    else:
        final = weights(model, ranks)
        if ranks.main:
            save_atomic(final, args.out)
        ranks.barrier()
    if ranks.main and args.log:
        write_text_atomic(args.log, "step,train_loss\n" + "".join(f"{s},{v:.6f}\n" for s, v in loss_log))
    if ranks.main and args.timing:
        timing = {"first_step": first_step, "last_step": last_step, "skipped_steps": skipped_steps,
                  "train_seconds": seconds, "world_size": ranks.world_size,
                  "threads": cfg.threads, "device": device, "precision": cfg.precision}
        write_text_atomic(args.timing, json.dumps(timing, indent=2) + "\n")
    if checkpoints and ranks.main:
        checkpoints.finish()


class Committed:
    def commit(self):
        pass


def save_resume(state, path, ranks, async_save=False):
    """The resume file (rank 0, after every rank finished the step), or under FSDP2 the resume directory;
    returns what to commit() (a background save under checkpoint.async)."""
    if ranks.sharded:
        from mmkit.sharded import save_resume_dir

        return save_resume_dir(state, path, ranks, async_save=async_save)
    ranks.barrier()
    if ranks.main:
        save_resume_file(state, path)
    ranks.barrier()  # ... and none goes on before the file is committed
    return Committed()


def auto_resume(checkpoints, fp, origin, ranks, model, optimizer, batch_generator, expected_gen_state, last_step):
    """Continue from the newest checkpoint of this very run; returns (first step, skipped, loss log) or None.

    A torn, damaged or foreign checkpoint is skipped with a warning naming it, and the next older one tried.
    """
    if ranks.main:
        checkpoints.clear_unfinished()
    ranks.barrier()
    for path in checkpoints.checkpoints():
        try:
            state = read_any(path)
            check_fingerprint(state["fingerprint"], fp, f"checkpoint {path}")
            if state["origin"] != origin:
                raise UserError(f"checkpoint {path} is of another run: origin {state['origin']}, this run's {origin}")
            check_resume(state, path, model=unwrap(model), optimizer=optimizer, last_step=last_step,
                         ignore=checked_elsewhere(path), expected_gen_state=expected_gen_state)
        except UserError as e:
            if ranks.main:
                print(f"warning: skipping checkpoint {path}: {e}", file=sys.stderr, flush=True)
            continue
        load_into(path, state, model, optimizer, batch_generator)
        if ranks.main:
            print(f"resume: continuing from checkpoint {path} (step {state['step']})", file=sys.stderr, flush=True)
        return state["step"] + 1, state["skipped_steps"], [tuple(row) for row in state["loss_log"]]
    return None


def read_any(path):
    from mmkit.sharded import is_resume_dir, read_resume_dir

    return read_resume_dir(path) if is_resume_dir(path) else read_resume(path)


def checked_elsewhere(path):
    """A directory's model and optimizer are checked by the manifest's sha256 and DCP's shape-checked load."""
    from mmkit.sharded import is_resume_dir

    return ("model", "optimizer") if is_resume_dir(path) else ()


def load_into(path, state, model, optimizer, batch_generator, load_optimizer=True, gen_state=True):
    from mmkit.sharded import is_resume_dir, load_sharded

    if is_resume_dir(path):
        load_sharded(path, model, optimizer, load_optimizer=load_optimizer)
    else:
        unwrap(model).load_state_dict(state["model"])
        if load_optimizer:
            optimizer.load_state_dict(state["optimizer"])
    if gen_state:
        batch_generator.set_state(state["gen_state"])


def resume_sha256(path) -> str:
    """What identifies the resume a run started from: the file, or a directory's resume.pth (which holds
    the sha256 of every shard file)."""
    from mmkit.sharded import META, is_resume_dir

    return sha256_file(Path(path) / META if is_resume_dir(path) else path)


def ablations(args) -> list[str]:
    flags = {"no_optim": "--no-optim", "no_skip": "--no-skip", "restart_schedule": "--restart-schedule",
             "reshard": "--reshard", "minimind_rescale": "--minimind-rescale", "allow_mismatch": "--allow-mismatch"}
    return [flag for name, flag in flags.items() if getattr(args, name)]


def resume(args, cfg, fp, ranks, model, optimizer, batch_generator, gen_state_at, last_step):
    """Load a resume file or directory into this run, every entry checked first; returns (first step, skipped)."""
    from mmkit.sharded import is_resume_dir

    is_dir = is_resume_dir(args.resume)
    if ranks.sharded and not is_dir:
        raise UserError(f"resume file {args.resume} holds whole tensors; an fsdp2 run continues from a resume "
                        "directory (.dcp), or continue this file under ddp or on one rank")
    state = read_any(args.resume)
    saved_ws = state["fingerprint"].get("world_size", 1)
    source = f"resume {'directory' if is_dir else 'file'} {args.resume}"
    check_fingerprint(state["fingerprint"], fp, source, args.allow_mismatch, args.reshard)
    step = state["step"]
    if args.minimind_rescale:
        step = step * saved_ws // ranks.world_size
        print(f"resume: MiniMind's rescale: step {state['step']} * {saved_ws} // {ranks.world_size} = {step}; "
              f"data order re-derived from there", file=sys.stderr)
    # the ablations throw an entry away: it is named, not checked, not loaded
    ignore = ("optimizer",) * args.no_optim + ("gen_state",) * (args.no_skip or args.minimind_rescale)
    for entry in ignore:
        print(f"resume: ignoring entry '{entry}' of {args.resume}", file=sys.stderr)
    check_resume(state, args.resume, model=unwrap(model), optimizer=optimizer, last_step=last_step,
                 ignore=ignore + checked_elsewhere(args.resume), expected_gen_state=gen_state_at)
    load_into(args.resume, state, model, optimizer, batch_generator, load_optimizer=not args.no_optim,
              gen_state="gen_state" not in ignore)
    if args.no_skip:
        batch_generator.manual_seed(cfg.seed)  # back to step 1's batches: what a rewound sampler does
    elif args.minimind_rescale:
        batch_generator.set_state(gen_state_at(step))
    # else every rank took the file's one position (rank0_gen: rank 0's, so the others' is lost)
    return step + 1, state["skipped_steps"]


def step_number(text: str):
    return text if text == "config" else int(text)


if __name__ == "__main__":
    run_cli(main)
