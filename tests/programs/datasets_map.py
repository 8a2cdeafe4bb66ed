"""Tokenizes a JSON Lines file with `datasets` and trains on it, written as the datasets docs show: load_dataset
with a cache_dir of the user's (as run_clm.py passes --cache_dir), a batched map that tokenizes, then
with_format("torch") (https://huggingface.co/docs/datasets/use_with_pytorch). The first run fills the cache
(Arrow files and their locks); every later run reads what it wrote. Checkpoints go to {output_dir}/step_{N}.pt.
Not this project's code and no certificate code."""
import argparse
import os

import datasets

import torch  # noqa: E402  (after datasets, as such scripts begin)
from torch.utils.data import DataLoader  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--train_file", required=True)
p.add_argument("--cache_dir", required=True)
p.add_argument("--output_dir", required=True)
p.add_argument("--max_steps", type=int, default=8)
p.add_argument("--resume_from_checkpoint")
args = p.parse_args()

raw = datasets.load_dataset("json", data_files=args.train_file, split="train", cache_dir=args.cache_dir)


def tokenize(batch):
    ids = [[ord(c) % 64 for c in text[:16].ljust(16)] for text in batch["text"]]
    return {"input_ids": ids}


data = raw.map(tokenize, batched=True, remove_columns=["text"]).with_format("torch")

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Flatten(), torch.nn.Linear(16 * 16, 64))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
step = 0
if args.resume_from_checkpoint:
    state = torch.load(args.resume_from_checkpoint, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    step = state["step"]
os.makedirs(args.output_dir, exist_ok=True)
while step < args.max_steps:
    # each epoch's order from a generator seeded by the epoch: a resumed run draws it again
    epoch, skip = divmod(step, len(data) // 4)
    loader = DataLoader(data, batch_size=4, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(epoch))
    for i, batch in enumerate(loader):
        if i < skip:
            continue
        ids = batch["input_ids"]
        loss = torch.nn.functional.cross_entropy(model(ids), ids[:, 0])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                   os.path.join(args.output_dir, f"step_{step}.pt"))
        if step == args.max_steps:
            break
torch.save(model.state_dict(), os.path.join(args.output_dir, "final.pt"))
