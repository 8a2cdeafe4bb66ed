"""Train MiniMind: straight through, or stopped, or resumed with or without parts of the resume file.

  run.py --config C --tokens T --out straight.pth --loss-log straight_log.csv
  run.py --config C --tokens T --out resume.pth --stop-at 30            # OUT is then the resume file
  run.py --config C --tokens T --out resume.pth --stop-at               # ... stopped at the config's stop_at
  run.py --config C --tokens T --out resumed.pth --loss-log L --resume resume.pth [--no-optim|--no-skip|--restart-schedule]
"""

import argparse
import json
import sys
import time

from mmkit.atomic import write_text_atomic
from mmkit.checkpoint import check_fingerprint, check_resume, read_resume, resume_state, save_atomic, save_resume_file
from mmkit.config import load_config, run_config
from mmkit.data import generator_at, load_tokens
from mmkit.errors import UserError, run_cli
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
    tokens = load_tokens(args.tokens, cfg.model.vocab_size, cfg.seq_len + 2, "training tokens")
    model, optimizer, batch_generator = build(cfg, device, ranks)
    fp = fingerprint(cfg, device, tokens, ranks)
    drawn = cfg.batch_size // ranks.world_size if ranks.rank_generators else cfg.batch_size

    last_step = cfg.steps if stop_at is None else stop_at
    first_step, skipped_steps = 1, 0
    if args.resume:
        def gen_state_at(step):  # the data position after STEP batches of this run
            return generator_at(cfg.seed, step, len(tokens), drawn, cfg.seq_len).get_state()

        first_step, skipped_steps = resume(args, cfg, fp, ranks, model, optimizer, batch_generator, gen_state_at,
                                           last_step)

    if not first_step <= last_step <= cfg.steps:
        raise UserError(f"nothing to train: steps {first_step}..{last_step} of {cfg.steps}")

    t0 = time.perf_counter()
    offset = first_step - 1 if args.restart_schedule else 0
    rows = []
    for step, loss, skipped in train(cfg, device, model, optimizer, batch_generator, tokens, first_step, last_step,
                                     ranks, offset):
        rows.append(f"{step},{loss:.6f}")
        skipped_steps += skipped
        failpoint(f"step{step}")  # the tests kill one rank here, mid-run
    seconds = time.perf_counter() - t0

    if stop_at is not None:
        state = resume_state(*state_dicts(model, optimizer, ranks), last_step, skipped_steps, batch_generator, fp)
        if ranks.sharded:
            from mmkit.sharded import save_resume_dir

            save_resume_dir(state, args.out, ranks, async_save=cfg.async_save).commit()
        else:
            ranks.barrier()  # every rank has finished the step before rank 0 writes it down
            if ranks.main:
                save_resume_file(state, args.out)
            ranks.barrier()  # ... and none goes on before the file is committed
    else:
        final = weights(model, ranks)
        if ranks.main:
            save_atomic(final, args.out)
        ranks.barrier()
    if ranks.main and args.log:
        write_text_atomic(args.log, "step,train_loss\n" + "\n".join(rows) + "\n")
    if ranks.main and args.timing:
        timing = {"first_step": first_step, "last_step": last_step, "skipped_steps": skipped_steps,
                  "train_seconds": seconds, "world_size": ranks.world_size,
                  "threads": cfg.threads, "device": device, "precision": cfg.precision}
        write_text_atomic(args.timing, json.dumps(timing, indent=2) + "\n")


def resume(args, cfg, fp, ranks, model, optimizer, batch_generator, gen_state_at, last_step):
    """Load a resume file or directory into this run, every entry checked first; returns (first step, skipped)."""
    from mmkit.sharded import is_resume_dir, load_sharded, read_resume_dir

    is_dir = is_resume_dir(args.resume)
    if ranks.sharded and not is_dir:
        raise UserError(f"resume file {args.resume} holds whole tensors; an fsdp2 run continues from a resume "
                        "directory (.dcp), or continue this file under ddp or on one rank")
    state = read_resume_dir(args.resume) if is_dir else read_resume(args.resume)
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
    # a directory's model and optimizer are checked by the manifest's sha256 and DCP's shape-checked load
    checked_elsewhere = ("model", "optimizer") if is_dir else ()
    check_resume(state, args.resume, model=unwrap(model), optimizer=optimizer, last_step=last_step,
                 ignore=ignore + checked_elsewhere, expected_gen_state=gen_state_at)
    if is_dir:
        load_sharded(args.resume, model, optimizer, load_optimizer=not args.no_optim)
    else:
        unwrap(model).load_state_dict(state["model"])
        if not args.no_optim:
            optimizer.load_state_dict(state["optimizer"])
    if args.no_skip:
        batch_generator.manual_seed(cfg.seed)  # back to step 1's batches: what a rewound sampler does
    elif args.minimind_rescale:
        batch_generator.set_state(gen_state_at(step))
    else:
        batch_generator.set_state(state["gen_state"])  # rank0_gen: every rank takes rank 0's position
    return step + 1, state["skipped_steps"]


def step_number(text: str):
    return text if text == "config" else int(text)


if __name__ == "__main__":
    run_cli(main)
