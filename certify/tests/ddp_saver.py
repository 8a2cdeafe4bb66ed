"""Two gloo ranks under torchrun, saving as transformers' Trainer lays out a checkpoint: checkpoint-<step>/
with the model and optimizer from rank 0 and rng_state_<rank>.pth from each rank; the resume takes the
highest checkpoint-<step> and, as Trainer does, goes on without a rank's RNG file if it is missing (a
warning, not an error). Dropout draws from each rank's global RNG: certify --crash's test subject for a
silent resume.
"""

import argparse
import os
import re

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=4)
p.add_argument("--every", type=int, default=2)
args = p.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5),
                                                                      torch.nn.Linear(8, 1)))
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
torch.manual_seed(100 + rank)  # each rank's own dropout stream: all that rng_state_<rank>.pth holds


def save(step):
    folder = os.path.join(args.out, f"checkpoint-{step}")
    if rank == 0:
        os.makedirs(folder, exist_ok=True)
        torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step}, os.path.join(folder, "model.pt"))
    dist.barrier()
    for writer in range(dist.get_world_size()):  # one rank after the other, in rank order: the crash states
        if writer == rank:  # between are the same in every run (Trainer's ranks write at once, in a race)
            torch.save({"rng": torch.get_rng_state()}, os.path.join(folder, f"rng_state_{rank}.pth"))
        dist.barrier()


start = 0
steps = [int(m[1]) for d in (os.listdir(args.out) if os.path.isdir(args.out) else [])
         if (m := re.fullmatch(r"checkpoint-(\d+)", d))]
if steps:
    folder = os.path.join(args.out, f"checkpoint-{max(steps)}")
    state = torch.load(os.path.join(folder, "model.pt"), weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    start = state["step"]
    rng = os.path.join(folder, f"rng_state_{rank}.pth")
    if os.path.exists(rng):
        kept = torch.load(rng, weights_only=True)
        torch.set_rng_state(kept["rng"])
    else:
        print(f"rank {rank}: no {rng}: the RNG is not restored", flush=True)
for step in range(start + 1, args.steps + 1):
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1000 * step + rank))  # each step's own batch
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % args.every == 0:
        save(step)
dist.destroy_process_group()
