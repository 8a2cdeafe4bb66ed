"""The audit's reference row: this project's own recipe in a plain PyTorch loop, on the audit's model and data.

What makes it exact is what mmkit's resume file holds: the weights, AdamW, the scheduler, the scaler, the
data position as a value (epoch, batch: each epoch's order comes from its own generator, seed + epoch, so
nothing else moves it), and the global RNG; written atomically by mmkit.checkpoint, read with weights_only.
"""

from pathlib import Path

import torch

from mmkit.audit import (BATCH_SIZE, GRAD_CLIP, LR, SAMPLES, STEPS, WEIGHT_DECAY, Certificate, CutState,
                         adapter_args, build_model, collate, cosine, load_inputs, resume_source, rng_states,
                         run_adapter, save_weights, set_rng_states, without_optimizer_state)
from mmkit.checkpoint import load_file, save_atomic
from mmkit.errors import UserError


def epoch_order(seed: int, epoch: int) -> list:
    """The batches of EPOCH, from a generator of its own."""
    return torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(seed + epoch)).view(-1, BATCH_SIZE).tolist()


def empty_optimizer(folder: Path) -> None:
    for path in folder.glob("step_*.pth"):
        state = load_file(path, "resume file")
        save_atomic({**state, "optimizer": without_optimizer_state(state["optimizer"])}, path)


def main():
    args = adapter_args(__doc__).parse_args()
    settings, scenario, data = load_inputs(args, "own")
    seed = settings.seed
    model = build_model(scenario, settings.model.vocab_size, seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine)
    scaler = torch.amp.GradScaler("cpu") if scenario.precision == "fp16" else None
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(scenario.precision)
    step, epoch, batch = 0, 0, 0
    checkpoints = Path(args.checkpoints)
    if args.mode == "resumed":
        files = sorted(resume_source(args, empty_optimizer).glob("step_*.pth"))
        if not files:
            raise UserError(f"resume failed: no step_*.pth in {args.resume_from}")
        state = load_file(files[-1], "resume file")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        if scaler:
            scaler.load_state_dict(state["scaler"])
        set_rng_states(state["rng"])
        step, epoch, batch = state["step"], state["epoch"], state["batch"]

    certificate, cut = Certificate(), CutState(args, scenario.cut)
    last = scenario.cut if args.mode == "stop" else STEPS
    model.train()
    while step < last:
        order = epoch_order(seed, epoch)
        loader = torch.utils.data.DataLoader(data, batch_sampler=order[batch:], num_workers=scenario.workers,
                                             collate_fn=collate, generator=torch.Generator().manual_seed(seed))
        batches = iter(loader)
        while batch < len(order) and step < last:
            cut.at_step_start(step + 1)
            lr, samples = optimizer.param_groups[0]["lr"], []
            for _ in range(scenario.accumulation):
                b = next(batches)
                samples += b["idx"].tolist()
                with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                    loss = model(input_ids=b["input_ids"], labels=b["labels"])["loss"] / scenario.accumulation
                (scaler.scale(loss) if scaler else loss).backward()
            if scaler:
                scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            step, batch = step + 1, batch + scenario.accumulation
            certificate.record(step, samples, lr, model, optimizer)
            if args.mode == "stop" and step == scenario.cut:
                position = (epoch + 1, 0) if batch == len(order) else (epoch, batch)
                checkpoints.mkdir(parents=True, exist_ok=True)
                save_atomic({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                             "schedule": schedule.state_dict(), "scaler": scaler.state_dict() if scaler else None,
                             "rng": rng_states(), "step": step, "epoch": position[0], "batch": position[1]},
                            checkpoints / f"step_{step:06d}.pth")
        if batch == len(order):
            epoch, batch = epoch + 1, 0
    certificate.save(args.certificate)
    if args.weights:
        save_weights(model, args.weights)


if __name__ == "__main__":
    run_adapter(main)
