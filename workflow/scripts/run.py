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
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path

from mmkit.atomic import sha256_file, write_text_atomic
from mmkit.autoresume import CheckpointDir, Preemption
from mmkit.checkpoint import (check_fingerprint, check_resume, global_rng_state, read_resume, resume_state, save_atomic,
                              save_resume_file, set_global_rng_state)
from mmkit.config import load_config, run_config
from mmkit.data import EpochBatches, PretrainDataset, StepPlan, WindowBatches, generator_at, load_tokens
from mmkit.errors import Preempted, UserError, run_cli
from mmkit.failpoint import failpoint
from mmkit.hardware import isa_summary, resolve_precision
from mmkit.parallel import start, state_dicts, unwrap, weights
from mmkit.train import build, fingerprint, make_deterministic, train


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="config YAML: config.yaml, or a job's settings file")
    p.add_argument("--tokens", help="training tokens, 1-D integer .npy (data.format: windows)")
    p.add_argument("--jsonl", help='training documents, {"text": ...} per line (data.format: minimind)')
    p.add_argument("--tokenizer", help="tokenizer.json for --jsonl")
    p.add_argument("--out", required=True, help="weights file, or the resume file (directory under fsdp2) with --stop-at")
    p.add_argument("--loss-log", dest="log", help="CSV step,train_loss of the steps this run trains")
    p.add_argument("--stop-at", nargs="?", const="config", type=step_number,
                   help="stop after this step (alone: the config's stop_at) and write a resume file to --out")
    p.add_argument("--resume", help="continue from this resume file, or resume directory (.dcp)")
    p.add_argument("--no-optim", action="store_true", help="ablation: start AdamW afresh on resume")
    p.add_argument("--no-skip", action="store_true", help="ablation: re-seed the batch generator on resume")
    p.add_argument("--restart-schedule", action="store_true", help="ablation: count the LR schedule from 0 on resume")
    p.add_argument("--replay", action="store_true", help="ablation (minimind format): replay the epoch from its first batch")
    p.add_argument("--no-rng", action="store_true", help="ablation: leave the global RNG (dropout) as a fresh run has it")
    p.add_argument("--no-scaler", action="store_true", help="ablation (fp16): start the GradScaler afresh")
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
    resume_only = (args.no_optim, args.no_skip, args.restart_schedule, args.reshard, args.replay, args.no_rng,
                   args.no_scaler)
    if any(resume_only) and not args.resume:
        raise UserError("--no-optim, --no-skip, --restart-schedule, --reshard, --replay, --no-rng and --no-scaler "
                        "only make sense with --resume")
    if args.minimind_rescale and not args.reshard:
        raise UserError("--minimind-rescale is a rule for resuming on another world size: add --reshard")

    settings = load_config(args.config)
    cfg = run_config(settings)
    stop_at = settings.stop_at if args.stop_at == "config" else args.stop_at
    device = make_deterministic(cfg)
    if cfg.precision == "auto":  # decided here, once: the fingerprint, the timing and the report get the result
        cfg = dataclasses.replace(cfg, precision=resolve_precision(cfg.precision, device))
        print(f"precision: auto is {cfg.precision} on this {device} ({isa_summary()})", file=sys.stderr, flush=True)
    ranks = start(cfg.parallel, device, args.rank_generators)
    try:
        run(args, cfg, stop_at, device, ranks)
    finally:
        ranks.close()


def run(args, cfg, stop_at, device, ranks):
    preemption = Preemption()  # from here on a SIGTERM/SIGUSR1 is noted, and acted on after a step
    data = TrainingData(args, cfg)
    model, optimizer, batch_generator, scaler = build(cfg, device, ranks)
    fp = fingerprint(cfg, device, data.sha256, ranks)
    plan = StepPlan(cfg.accumulation_steps, data.batches_per_epoch)
    drawn = cfg.batch_size // ranks.world_size if ranks.rank_generators else cfg.batch_size

    def gen_state_at(consumed):  # the window generator after this many batches of this run
        n = consumed if data.windows else 0  # the minimind format never draws from it
        return generator_at(cfg.seed, n, data.n_tokens, drawn, cfg.seq_len).get_state()

    expected = Expected(plan, gen_state_at)
    last_step = cfg.steps if stop_at is None else stop_at
    first_step, skipped_steps, loss_log, position = 1, 0, [], plan.position(0)
    origin = {"resume_sha256": None, "ablations": []}
    if args.resume:
        first_step, skipped_steps, position = resume(args, cfg, fp, ranks, model, optimizer, batch_generator, scaler,
                                                     expected, last_step, data.windows)
        origin = {"resume_sha256": resume_sha256(args.resume), "ablations": ablations(args)}
    # the ablations that shift the LR schedule or the data position keep shifting them after a restart
    # (both in micro-batches)
    schedule_offset = plan.consumed(first_step - 1) if args.restart_schedule else 0
    expected.lag = plan.consumed(first_step - 1) - position_index(plan, position)

    checkpoints = CheckpointDir(args.checkpoint_dir, cfg.checkpoint) if args.checkpoint_dir else None
    if checkpoints:
        found = auto_resume(checkpoints, fp, origin, ranks, model, optimizer, batch_generator, scaler, expected,
                            last_step)
        if found:
            first_step, skipped_steps, loss_log, position = found
    batches = data.batches(position, batch_generator, drawn)

    if not first_step <= last_step <= cfg.steps:
        raise UserError(f"nothing to train: steps {first_step}..{last_step} of {cfg.steps}")

    def state_now(step):
        return resume_state(*state_dicts(model, optimizer, ranks), step, skipped_steps, batch_generator, fp, origin,
                            list(loss_log), data_position=dict(batches.position), rng_state=global_rng_state(),
                            scaler=scaler.state_dict() if scaler else None)

    def commit(pending):  # a checkpoint is whole once committed: only then may older ones go
        pending.commit()
        if ranks.main:
            checkpoints.prune()

    pending = None  # a checkpoint still being written in the background (checkpoint.async)
    t0 = time.perf_counter()
    for step, loss, skipped in train(cfg, device, model, optimizer, iter(batches), plan, first_step, last_step,
                                     ranks, schedule_offset, scaler):
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
                  "threads": cfg.threads, "device": device, "precision": cfg.precision, "cpu": isa_summary()}
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


class TrainingData:
    """The training data of either format: what the fingerprint hashes, and the batches from a position."""

    def __init__(self, args, cfg):
        self.cfg, self.windows = cfg, cfg.data_format == "windows"
        given = "--tokens" if args.tokens else "--jsonl" if args.jsonl else None
        wanted = "--tokens" if self.windows else "--jsonl"
        if given != wanted or (not self.windows and not args.tokenizer):
            raise UserError(f"data.format {cfg.data_format} trains on " + (
                "--tokens T.npy" if self.windows else "--jsonl J.jsonl --tokenizer tokenizer.json"))
        if self.windows:
            self.tokens = load_tokens(args.tokens, cfg.model.vocab_size, cfg.seq_len + 2, "training tokens")
            self.sha256 = hashlib.sha256(memoryview(self.tokens)).hexdigest()
            self.n_tokens, self.batches_per_epoch = len(self.tokens), None
        else:
            # a sample is MiniMind's max_length = seq_len + 1 tokens: the model reads seq_len of them
            self.dataset = PretrainDataset(args.jsonl, args.tokenizer, cfg.seq_len + 1, cfg.model.vocab_size)
            self.sha256 = hashlib.sha256(Path(args.jsonl).read_bytes() + Path(args.tokenizer).read_bytes()).hexdigest()
            self.n_tokens = 0
            self.epochs = EpochBatches(self.dataset, cfg.batch_size, cfg.seed, cfg.workers)
            self.batches_per_epoch = self.epochs.batches_per_epoch

    def batches(self, position: dict, batch_generator, drawn: int):
        if self.windows:
            return WindowBatches(self.tokens, drawn, self.cfg.seq_len, batch_generator, position)
        self.epochs.position = dict(position)
        return self.epochs


class Expected:
    """What a resume file of this run must hold after a step: the data position and the window generator's
    state, both after the batches read by then, less `lag` (the batches an ablation rewound)."""

    def __init__(self, plan, gen_state_at):
        self.plan, self.gen_state_at, self.lag = plan, gen_state_at, 0

    def position(self, step):
        return self.plan.position(self.plan.consumed(step) - self.lag)

    def gen_state(self, step):
        return self.gen_state_at(self.plan.consumed(step) - self.lag)


def position_index(plan, position) -> int:
    """Micro-batches read to reach POSITION."""
    return position["epoch"] * (plan.batches_per_epoch or 0) + position["batch"]


def auto_resume(checkpoints, fp, origin, ranks, model, optimizer, batch_generator, scaler, expected, last_step):
    """Continue from the newest checkpoint of this very run; returns (first step, skipped, loss log, data
    position) or None.

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
                         ignore=checked_elsewhere(path), expected_gen_state=expected.gen_state,
                         expected_position=expected.position, scaler=scaler)
        except UserError as e:
            if ranks.main:
                print(f"warning: skipping checkpoint {path}: {e}", file=sys.stderr, flush=True)
            continue
        load_into(path, state, model, optimizer, batch_generator, scaler)
        if ranks.main:
            print(f"resume: continuing from checkpoint {path} (step {state['step']})", file=sys.stderr, flush=True)
        return (state["step"] + 1, state["skipped_steps"], [tuple(row) for row in state["loss_log"]],
                state["data_position"])
    return None


def read_any(path):
    from mmkit.sharded import is_resume_dir, read_resume_dir

    return read_resume_dir(path) if is_resume_dir(path) else read_resume(path)


def checked_elsewhere(path):
    """A directory's model and optimizer are checked by the manifest's sha256 and DCP's shape-checked load."""
    from mmkit.sharded import is_resume_dir

    return ("model", "optimizer") if is_resume_dir(path) else ()


def load_into(path, state, model, optimizer, batch_generator, scaler, ignore=()):
    """Every entry of STATE not in IGNORE into this run (the data position is the caller's to use)."""
    from mmkit.sharded import is_resume_dir, load_sharded

    if is_resume_dir(path):
        load_sharded(path, model, optimizer, load_optimizer="optimizer" not in ignore)
    else:
        unwrap(model).load_state_dict(state["model"])
        if "optimizer" not in ignore:
            optimizer.load_state_dict(state["optimizer"])
    if "gen_state" not in ignore:
        batch_generator.set_state(state["gen_state"])
    if "rng_state" not in ignore:
        set_global_rng_state(state["rng_state"])
    if scaler and "scaler" not in ignore:
        scaler.load_state_dict(state["scaler"])


def resume_sha256(path) -> str:
    """What identifies the resume a run started from: the file, or a directory's resume.pth (which holds
    the sha256 of every shard file)."""
    from mmkit.sharded import META, is_resume_dir

    return sha256_file(Path(path) / META if is_resume_dir(path) else path)


def ablations(args) -> list[str]:
    flags = {"no_optim": "--no-optim", "no_skip": "--no-skip", "restart_schedule": "--restart-schedule",
             "reshard": "--reshard", "minimind_rescale": "--minimind-rescale", "allow_mismatch": "--allow-mismatch",
             "replay": "--replay", "no_rng": "--no-rng", "no_scaler": "--no-scaler"}
    return [flag for name, flag in flags.items() if getattr(args, name)]


def resume(args, cfg, fp, ranks, model, optimizer, batch_generator, scaler, expected, last_step, windows):
    """Load a resume file or directory into this run, every entry checked first; returns (first step, skipped,
    data position)."""
    from mmkit.sharded import is_resume_dir

    is_dir = is_resume_dir(args.resume)
    if ranks.sharded and not is_dir:
        raise UserError(f"resume file {args.resume} holds whole tensors; an fsdp2 run continues from a resume "
                        "directory (.dcp), or continue this file under ddp or on one rank")
    if args.replay and windows:
        raise UserError("--replay replays an epoch: it needs data.format minimind (the windows format has no "
                        "epochs; --no-skip rewinds it)")
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
    rewound = args.no_skip or args.minimind_rescale or args.replay
    ignore = (("optimizer",) * args.no_optim + ("gen_state", "data_position") * rewound
              + ("rng_state",) * args.no_rng + ("scaler",) * args.no_scaler)
    for entry in ignore:
        print(f"resume: ignoring entry '{entry}' of {args.resume}", file=sys.stderr)
    check_resume(state, args.resume, model=unwrap(model), optimizer=optimizer, last_step=last_step,
                 ignore=ignore + checked_elsewhere(args.resume), expected_gen_state=expected.gen_state,
                 expected_position=expected.position, scaler=scaler)
    load_into(args.resume, state, model, optimizer, batch_generator, scaler, ignore)
    position = state["data_position"]
    if args.no_skip:
        batch_generator.manual_seed(cfg.seed)  # back to step 1's batches: what a rewound sampler does
        position = expected.plan.position(0)
    elif args.replay:
        position = {"epoch": position["epoch"], "batch": 0}  # the epoch again from its first batch
    elif args.minimind_rescale:
        batch_generator.set_state(expected.gen_state(step))
        position = expected.position(step)
    # else every rank took the file's one position (rank0_gen: rank 0's, so the others' is lost)
    return step + 1, state["skipped_steps"], position


def step_number(text: str):
    return text if text == "config" else int(text)


if __name__ == "__main__":
    run_cli(main)
