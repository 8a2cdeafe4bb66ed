"""Train a small MLP regressor, saving the model every step but the (larger) optimizer state only
every 3 steps into one optimizer.pt. Resume loads the optimizer from optimizer.pt, which may be from
an earlier step than the model checkpoint it is paired with.
"""
import argparse
import os

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--max_steps", type=int, default=8)
parser.add_argument("--opt_save_every", type=int, default=3)
parser.add_argument("--resume", default=None)
args = parser.parse_args()

torch.manual_seed(3)
torch.set_num_threads(1)
os.makedirs(args.out_dir, exist_ok=True)

model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)


def get_batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(16, 8, generator=g)
    return x, torch.stack([x[:, :4].sum(1), x[:, 4:].prod(1)], dim=1)


step = 0
if args.resume:
    ckpt = torch.load(args.resume)
    model.load_state_dict(ckpt["model"])
    step = ckpt["step"]
    optimizer.load_state_dict(torch.load(os.path.join(os.path.dirname(args.resume), "optimizer.pt")))
    print(f"resumed from {args.resume} at step {step}")

while step < args.max_steps:
    x, y = get_batch(step)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    print(f"step {step} loss {loss.item():.4f}")
    torch.save({"model": model.state_dict(), "step": step}, os.path.join(args.out_dir, f"ckpt_{step}.pt"))
    if step % args.opt_save_every == 0:
        torch.save(optimizer.state_dict(), os.path.join(args.out_dir, "optimizer.pt"))

torch.save(model.state_dict(), os.path.join(args.out_dir, "final.pt"))
