# A training script as people write them: a small regression model, a batch of random rows each step drawn
# with its own generator, AdamW, a checkpoint every step (ckpt_0003.pt), and --resume to continue from one.
# --forget-sampler resumes without the generator's state, as many scripts do.
import argparse
import os

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--resume")
parser.add_argument("--forget-sampler", action="store_true")
args = parser.parse_args()
os.makedirs(args.out, exist_ok=True)

torch.manual_seed(0)
torch.set_num_threads(1)
x, y = torch.randn(64, 8), torch.randn(64, 1)
sampler = torch.Generator().manual_seed(1)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
step = 0
if args.resume:
    ckpt = torch.load(args.resume, weights_only=True)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    step = ckpt["step"]
    if not args.forget_sampler:
        sampler.set_state(ckpt["sampler"])

while step < args.steps:
    rows = torch.randint(0, len(x), (8,), generator=sampler)
    loss = nn.functional.mse_loss(model(x[rows]), y[rows])
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                "sampler": sampler.get_state()}, os.path.join(args.out, f"ckpt_{step:04d}.pt"))
torch.save(model.state_dict(), os.path.join(args.out, "final.pt"))
