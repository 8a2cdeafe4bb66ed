"""Train MiniMind: straight through, or stopped, or resumed with or without parts of the resume file.

  run.py --config C --tokens T --out straight.pth --log straight_log.csv
  run.py --config C --tokens T --out resume.pth --stop-at 30            # OUT is then the resume file
  run.py --config C --tokens T --out resume.pth --stop-at               # ... stopped at the config's stop_at
  run.py --config C --tokens T --out resumed.pth --log L --resume resume.pth [--no-optim|--no-skip|--restart-schedule]
"""

import argparse
import json
import sys
import time

from mmkit.atomic import write_text_atomic
from mmkit.checkpoint import check_resume, read_resume, resume_state, save_atomic
from mmkit.config import load_config, run_config
from mmkit.data import generator_at, load_tokens
from mmkit.errors import UserError, run_cli
from mmkit.train import build, fingerprint, make_deterministic, train


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="config YAML: config.yaml, or a job's settings file")
    p.add_argument("--tokens", required=True, help="training tokens, 1-D integer .npy")
    p.add_argument("--out", required=True, help="weights file, or the resume file with --stop-at")
    p.add_argument("--log", help="CSV step,train_loss of the steps this run trains")
    p.add_argument("--stop-at", nargs="?", const="config", type=step_number,
                   help="stop after this step (alone: the config's stop_at) and write a resume file to --out")
    p.add_argument("--resume", help="continue from this resume file")
    p.add_argument("--no-optim", action="store_true", help="ablation: start AdamW afresh on resume")
    p.add_argument("--no-skip", action="store_true", help="ablation: re-seed the batch generator on resume")
    p.add_argument("--restart-schedule", action="store_true", help="ablation: count the LR schedule from 0 on resume")
    p.add_argument("--timing", help="JSON with this run's steps and wall time")
    p.add_argument("--allow-mismatch", action="store_true", help="resume despite other settings (not bit-exact)")
    args = p.parse_args()
    if (args.no_optim or args.no_skip or args.restart_schedule) and not args.resume:
        raise UserError("--no-optim, --no-skip and --restart-schedule only make sense with --resume")

    settings = load_config(args.config)
    cfg = run_config(settings)
    stop_at = settings.stop_at if args.stop_at == "config" else args.stop_at
    device = make_deterministic(cfg)
    tokens = load_tokens(args.tokens, cfg.model.vocab_size, cfg.seq_len + 2, "training tokens")
    model, optimizer, batch_generator = build(cfg, device)
    fp = fingerprint(cfg, device, tokens)

    last_step = cfg.steps if stop_at is None else stop_at
    first_step, skipped_steps = 1, 0
    if args.resume:
        state = read_resume(args.resume, fp, args.allow_mismatch)
        # the ablations throw an entry away: it is named, not checked, not loaded
        ignore = ("optimizer",) * args.no_optim + ("gen_state",) * args.no_skip
        for entry in ignore:
            print(f"resume: ignoring entry '{entry}' of {args.resume}", file=sys.stderr)
        check_resume(state, args.resume, model=model, optimizer=optimizer, last_step=last_step, ignore=ignore,
                     expected_gen_state=lambda step: generator_at(
                         cfg.seed, step, len(tokens), cfg.batch_size, cfg.seq_len).get_state())
        model.load_state_dict(state["model"])
        if not args.no_optim:
            optimizer.load_state_dict(state["optimizer"])
        if args.no_skip:
            batch_generator.manual_seed(cfg.seed)  # back to step 1's batches: what a rewound sampler does
        else:
            batch_generator.set_state(state["gen_state"])
        first_step, skipped_steps = state["step"] + 1, state["skipped_steps"]

    if not first_step <= last_step <= cfg.steps:
        raise UserError(f"nothing to train: steps {first_step}..{last_step} of {cfg.steps}")

    t0 = time.perf_counter()
    offset = first_step - 1 if args.restart_schedule else 0
    rows = []
    for step, loss, skipped in train(cfg, device, model, optimizer, batch_generator, tokens, first_step, last_step,
                                     offset):
        rows.append(f"{step},{loss:.6f}")
        skipped_steps += skipped
    seconds = time.perf_counter() - t0

    if stop_at is not None:
        save_atomic(resume_state(model, optimizer, last_step, skipped_steps, batch_generator, fp), args.out)
    else:
        save_atomic(model.state_dict(), args.out)
    if args.log:
        write_text_atomic(args.log, "step,train_loss\n" + "\n".join(rows) + "\n")
    if args.timing:
        timing = {"first_step": first_step, "last_step": last_step, "skipped_steps": skipped_steps,
                  "train_seconds": seconds,
                  "threads": cfg.threads, "device": device, "precision": cfg.precision}
        write_text_atomic(args.timing, json.dumps(timing, indent=2) + "\n")


def step_number(text: str):
    return text if text == "config" else int(text)


if __name__ == "__main__":
    run_cli(main)
