"""A small training script that saves its checkpoint in one of the ways people write, and resumes by itself
from what it finds in --out (no resume argument): certify --crash's test subject.

  overwrite    torch.save over its only checkpoint, ckpt.pt
  replace      ckpt.pt.tmp written, then os.replace over ckpt.pt: no fsync of the file or the folder
  durable      the same with the file fsynced before the rename and the folder after it
  folders      checkpoint-<step>/ holding model.pt and optim.pt; the resume takes the highest number, as
               transformers' Trainer does with resume_from_checkpoint=True, without checking it is whole
  pointer      ckpt-<step>.pt written durably, then latest.txt (durably) naming it; the resume reads
               latest.txt, so a crash between the two resumes from the older one
"""

import argparse
import os
import re

import torch

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--save", required=True, choices=["overwrite", "replace", "durable", "folders", "pointer"])
p.add_argument("--steps", type=int, default=6)
p.add_argument("--every", type=int, default=2)
args = p.parse_args()
os.makedirs(args.out, exist_ok=True)

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(1)


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_save(obj, path):
    with open(path + ".tmp", "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    fsync_dir(os.path.dirname(path))


def save(step):
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "data": data.get_state(), "step": step}
    ckpt = os.path.join(args.out, "ckpt.pt")
    if args.save == "overwrite":
        torch.save(state, ckpt)
    elif args.save == "replace":
        torch.save(state, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
    elif args.save == "durable":
        durable_save(state, ckpt)
    elif args.save == "folders":
        folder = os.path.join(args.out, f"checkpoint-{step}")
        os.makedirs(folder, exist_ok=True)
        torch.save({"model": state["model"], "step": step}, os.path.join(folder, "model.pt"))
        torch.save({"optim": state["optim"], "data": state["data"]}, os.path.join(folder, "optim.pt"))
    else:
        name = f"ckpt-{step}.pt"
        durable_save(state, os.path.join(args.out, name))
        with open(os.path.join(args.out, "latest.txt.tmp"), "w") as f:
            f.write(name)
            f.flush()
            os.fsync(f.fileno())
        os.replace(os.path.join(args.out, "latest.txt.tmp"), os.path.join(args.out, "latest.txt"))
        fsync_dir(args.out)


def load():
    """The state to resume from, as this script's authors wrote it: whatever is there, trusted."""
    if args.save == "folders":
        steps = [int(m[1]) for d in os.listdir(args.out) if (m := re.fullmatch(r"checkpoint-(\d+)", d))]
        if not steps:
            return None
        folder = os.path.join(args.out, f"checkpoint-{max(steps)}")
        a = torch.load(os.path.join(folder, "model.pt"), weights_only=True)
        b = torch.load(os.path.join(folder, "optim.pt"), weights_only=True)
        return {"model": a["model"], "step": a["step"], **b}
    if args.save == "pointer":
        latest = os.path.join(args.out, "latest.txt")
        if not os.path.exists(latest):
            return None
        return torch.load(os.path.join(args.out, open(latest).read()), weights_only=True)
    ckpt = os.path.join(args.out, "ckpt.pt")
    return torch.load(ckpt, weights_only=True) if os.path.exists(ckpt) else None


start, state = 0, load()
if state is not None:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    data.set_state(state["data"])
    start = state["step"]
print(f"resumed from step {start}", flush=True)  # what ckpt-chaos's --step-regex reads (bench/crash_side_by_side.py)
for step in range(start + 1, args.steps + 1):
    x = torch.randn(16, 8, generator=data)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % args.every == 0:
        save(step)
torch.save(model.state_dict(), os.path.join(args.out, "final.pt"))  # the weights both tools compare
