"""Train a tiny next-token classifier on a map-style Dataset whose __getitem__ randomly swaps the
first token for a special token (MiniMind pre_processing_chat style), using Python's global random.
The resume skips the batches already seen but saves no Python random state, so later draws differ.
"""
import argparse
import os
import random

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, SequentialSampler

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--max_steps", type=int, default=8)
parser.add_argument("--resume", default=None)
args = parser.parse_args()

random.seed(42)
torch.manual_seed(42)
torch.set_num_threads(1)
os.makedirs(args.out_dir, exist_ok=True)
VOCAB, SEQ, SPECIAL = 20, 6, 0


class ChatDataset(Dataset):
    def __init__(self, n):
        self.samples = [[(7 * i + 3 * j) % (VOCAB - 1) + 1 for j in range(SEQ + 1)] for i in range(n)]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, idx):
        tokens = list(self.samples[idx])
        if random.random() < 0.5:  # pre_processing_chat: sometimes swap in a system token
            tokens[0] = SPECIAL
        t = torch.tensor(tokens)
        return t[:-1], t[1:]


class SkipBatchSampler(Sampler):
    def __init__(self, sampler, batch_size, skip_batches=0):
        self.sampler, self.batch_size, self.skip_batches = sampler, batch_size, skip_batches

    def __iter__(self):
        batch, skipped = [], 0
        for idx in self.sampler:
            batch.append(idx)
            if len(batch) == self.batch_size:
                if skipped < self.skip_batches:
                    skipped += 1
                else:
                    yield batch
                batch = []

    def __len__(self):
        return len(self.sampler) // self.batch_size - self.skip_batches


model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 12), torch.nn.Linear(12, VOCAB))
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
dataset = ChatDataset(64)

start_step = 0
if args.resume:
    ckpt = torch.load(args.resume)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    start_step = ckpt["step"]
    print(f"resumed from {args.resume} at step {start_step}")

sampler = SkipBatchSampler(SequentialSampler(dataset), batch_size=4, skip_batches=start_step)
loader = DataLoader(dataset, batch_sampler=sampler, num_workers=0)
for step, (x, y) in enumerate(loader, start=start_step + 1):
    if step > args.max_steps:
        break
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
               os.path.join(args.out_dir, f"ckpt_{step}.pt"))

torch.save(model.state_dict(), os.path.join(args.out_dir, "final.pt"))
