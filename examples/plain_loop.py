"""A plain PyTorch training loop that checkpoints and resumes, the way a hand-written one does: certify's
example of a script that is not a framework's (python examples/plain_loop.py, or under torchrun: DDP over gloo).

Every --save-every optimizer steps it writes {out}/step_{k}.pt: the model, AdamW, the LR schedule, the step,
and the shuffle generator's state at the start of the step's epoch with that epoch's number (the resumed run
draws the same order and skips the batches already trained on: after an epoch's last step, the whole epoch,
whose sampler draws once more as it ends); each rank writes its own RNG state beside it (dropout draws per rank).
--forget leaves one of them out, as a buggy script would: certify names what it forgot.
"""

import argparse
import itertools
import math
import os
from pathlib import Path

import torch
import torch.distributed as dist

from tiny_lm import TinyLM, random_tokens

BATCH = 8


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the folder of the checkpoints")
    p.add_argument("--resume", help="a step_{k}.pt to continue from")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--save-every", type=int, default=1)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--forget", choices=("generator", "rng-rank1", "optimizer"),
                   help="leave this out of the resume: the shuffle generator, rank 1's RNG, AdamW's moments")
    args = p.parse_args()

    distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.set_num_threads(1)
    torch.manual_seed(0)  # before the model: every rank builds the same weights
    model = TinyLM(args.dropout)
    train = torch.nn.parallel.DistributedDataParallel(model) if distributed else model  # saved without its "module."
    torch.manual_seed(1 + rank)  # each rank its own dropout stream
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / args.steps)))
    data = torch.utils.data.TensorDataset(random_tokens())
    shuffle = torch.Generator().manual_seed(3)
    sampler = (torch.utils.data.DistributedSampler(data, world, rank, seed=3) if distributed else
               torch.utils.data.RandomSampler(data, generator=shuffle))
    # generator: the loader draws its workers' base seed from it at each epoch, not from the global RNG (whose
    # state, saved mid-epoch, already holds that draw: a resumed run would draw it twice)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH // world, sampler=sampler, generator=shuffle)

    step, epoch, loss, out = 0, 0, None, Path(args.out)
    if args.resume:
        state = torch.load(args.resume, weights_only=True)
        model.load_state_dict(state["model"])
        schedule.load_state_dict(state["schedule"])
        step, epoch = state["step"], state["epoch"]
        if args.forget == "optimizer":  # AdamW's moments and counts gone, its hyperparameters and LR kept
            state["optimizer"]["state"] = {}
        optimizer.load_state_dict(state["optimizer"])
        if args.forget != "generator":
            shuffle.set_state(state["shuffle_at_epoch_start"])
        if not (args.forget == "rng-rank1" and rank == 1):
            torch.set_rng_state(torch.load(f"{args.resume}.rank{rank}", weights_only=True))
    out.mkdir(parents=True, exist_ok=True)
    skip = step - epoch * len(loader)
    while step < args.steps:
        at_epoch_start = shuffle.get_state()
        if distributed:
            sampler.set_epoch(epoch)
        for (batch,) in itertools.islice(loader, skip, None):
            loss = train(batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            step += 1
            if step % args.save_every == 0:
                save(out / f"step_{step}.pt", rank, step, model, optimizer, schedule, epoch, at_epoch_start)
            if step == args.steps:
                break
        epoch, skip = epoch + 1, 0
    if rank == 0 and loss is not None:
        print(f"trained {step} steps, loss {loss.item():.4f}")
    if distributed:
        dist.destroy_process_group()


def save(path: Path, rank, step, model, optimizer, schedule, epoch, at_epoch_start) -> None:
    if rank == 0:
        state = {"model": model.state_dict(), "schedule": schedule.state_dict(), "step": step, "epoch": epoch,
                 "shuffle_at_epoch_start": at_epoch_start}
        state["optimizer"] = optimizer.state_dict()
        torch.save(state, path)
    torch.save(torch.get_rng_state(), f"{path}.rank{rank}")
    if dist.is_initialized():
        dist.barrier()  # every rank's file is written before any rank goes on


if __name__ == "__main__":
    main()
