"""Train a small MLP regressor, MiniMind style, with a checkpoint after every step.

The checkpoint helper stores the weights in half precision (to save disk); resume restores the
optimizer, step and RNG states exactly, but the weights come back with their fp16 rounding.
"""
import argparse
import os

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--max_steps", type=int, default=8)
parser.add_argument("--resume", default=None)
args = parser.parse_args()

torch.manual_seed(42)
torch.set_num_threads(1)
os.makedirs(args.out_dir, exist_ok=True)

model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
data_gen = torch.Generator().manual_seed(1234)
true_w = torch.linspace(-1, 1, 16)


def lm_checkpoint(step):
    state_dict = {k: v.half() for k, v in model.state_dict().items()}
    ckp = {"model": state_dict, "optimizer": optimizer.state_dict(), "step": step,
           "rng": torch.get_rng_state(), "data_rng": data_gen.get_state()}
    torch.save(ckp, os.path.join(args.out_dir, f"ckpt_{step}.pt"))


start_step = 0
if args.resume:
    ckp = torch.load(args.resume)
    model.load_state_dict({k: v.float() for k, v in ckp["model"].items()})
    optimizer.load_state_dict(ckp["optimizer"])
    start_step = ckp["step"]
    torch.set_rng_state(ckp["rng"])
    data_gen.set_state(ckp["data_rng"])
    print(f"resumed from {args.resume} at step {start_step}")

for step in range(start_step + 1, args.max_steps + 1):
    x = torch.randn(8, 16, generator=data_gen)
    y = (x @ true_w).sin().unsqueeze(1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.5f}")
    lm_checkpoint(step)

torch.save(model.state_dict(), os.path.join(args.out_dir, "final.pt"))
