"""Trains for a few epochs and resumes by itself from the newest checkpoint in its output folder (as
transformers' get_last_checkpoint and many hand-written trainers do). It saves the model, the optimizer and
where it is in the data, but not the global RNG: its DataLoader has no generator of its own, so each epoch's
iterator draws a base seed from the global RNG that nothing it trains uses."""
import argparse
import glob
import os
import re

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("output_dir")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--save_steps", type=int, default=1)
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(0)
xs = torch.randn(16, 8, generator=g)
ys = xs.sum(1, keepdim=True)
loader = DataLoader(TensorDataset(xs, ys), batch_size=4, shuffle=False)  # 4 steps an epoch

global_step = 0
checkpoints = sorted(glob.glob(os.path.join(args.output_dir, "ckpt_*.pt")),
                     key=lambda p: int(re.findall(r"\d+", os.path.basename(p))[0]))
if checkpoints:
    ckpt = torch.load(checkpoints[-1], weights_only=True)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    global_step = ckpt["global_step"]
    print("resumed from", checkpoints[-1])

os.makedirs(args.output_dir, exist_ok=True)
start_epoch, skip = divmod(global_step, len(loader))
for epoch in range(start_epoch, args.epochs):
    for i, (x, y) in enumerate(loader):
        if epoch == start_epoch and i < skip:
            continue
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        global_step += 1
        if global_step % args.save_steps == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "global_step": global_step},
                       os.path.join(args.output_dir, f"ckpt_{global_step}.pt"))
torch.save(model.state_dict(), os.path.join(args.output_dir, "model_final.pt"))
