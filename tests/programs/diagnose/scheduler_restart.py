"""Fit a small MLP classifier with AdamW and a warmup-then-linear-decay LambdaLR schedule.

The checkpoint saves model, optimizer, step and the data generator, but not the LR scheduler:
a resumed run builds a fresh scheduler, so the learning rate schedule restarts from step 1.
"""
import argparse
import os

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--max_steps", type=int, default=8)
parser.add_argument("--warmup_steps", type=int, default=3)
parser.add_argument("--lr_decay_steps", type=int, default=8)
parser.add_argument("--lr", type=float, default=1e-2)
parser.add_argument("--resume", default=None)
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
os.makedirs(args.out_dir, exist_ok=True)

model = torch.nn.Sequential(torch.nn.Linear(10, 24), torch.nn.Tanh(), torch.nn.Linear(24, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)


def lr_lambda(current_step):
    if current_step < args.warmup_steps:
        return (current_step + 1) / args.warmup_steps
    return max(0.0, (args.lr_decay_steps - current_step) / max(1, args.lr_decay_steps - args.warmup_steps))


g = torch.Generator().manual_seed(7)

step = 0
if args.resume:
    ckpt = torch.load(args.resume)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    g.set_state(ckpt["data_rng"])
    step = ckpt["step"]
    print(f"resumed from {args.resume} at step {step}")

scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)

while step < args.max_steps:
    x = torch.randn(16, 10, generator=g)
    y = (x[:, :3].argmax(dim=1) + (x[:, 3] > 1).long()) % 3
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    step += 1
    print(f"step {step} loss {loss.item():.4f} lr {lr:.5f}")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                "data_rng": g.get_state()}, os.path.join(args.out_dir, f"ckpt_{step}.pt"))

torch.save(model.state_dict(), os.path.join(args.out_dir, "final.pt"))
