"""Train a small linear classifier for several epochs with a shuffling RandomSampler driven by its own
torch.Generator. The checkpoint keeps model, optimizer and step but not the sampler generator's state,
so a run resumed mid-epoch-2 reshuffles with the fresh generator and replays epoch 1's order.
"""
import argparse
import os

import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--max_steps", type=int, default=12)
parser.add_argument("--resume", default=None)
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
os.makedirs(args.out_dir, exist_ok=True)

features = torch.randn(16, 6)
labels = (features.sum(dim=1) > 0).long()
dataset = TensorDataset(features, labels)
g = torch.Generator()
g.manual_seed(0)
loader = DataLoader(dataset, batch_size=4, sampler=RandomSampler(dataset, generator=g))

model = torch.nn.Linear(6, 2)
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2)

step = 0
if args.resume:
    ckpt = torch.load(args.resume)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    step = ckpt["step"]
    print(f"resumed from {args.resume} at step {step}")

while step < args.max_steps:
    epoch, skip = divmod(step, len(loader))
    for i, (x, y) in enumerate(loader):
        if i < skip:  # batches of this epoch already trained before the resume
            continue
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                   os.path.join(args.out_dir, f"ckpt_{step}.pt"))
        if step >= args.max_steps:
            break

torch.save(model.state_dict(), os.path.join(args.out_dir, "final.pt"))
