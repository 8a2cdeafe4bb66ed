"""Train a tiny bigram-style language model on a fixed token stream, nanoGPT style.

The checkpoint keeps model, optimizer and iter_num but not the torch RNG state, and the script
reseeds with 1337 at every start, so a resumed run redraws the batch positions of step 1.
"""
import argparse
import os

import numpy as np
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--max_steps", type=int, default=8)
parser.add_argument("--resume", default=None)
args = parser.parse_args()

torch.manual_seed(1337)
torch.set_num_threads(1)
os.makedirs(args.out_dir, exist_ok=True)

# "dataset": a deterministic text mapped to token ids
text = ("the quick brown fox jumps over the lazy dog. " * 45)[:2000]
chars = sorted(set(text))
stoi = {c: i for i, c in enumerate(chars)}
data = torch.from_numpy(np.array([stoi[c] for c in text], dtype=np.int64))
vocab_size, block_size, batch_size, n_embd = len(chars), 8, 4, 16


def get_batch():
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x, y


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab_size, n_embd)
        self.lm_head = torch.nn.Linear(n_embd, vocab_size)

    def forward(self, idx, targets):
        logits = self.lm_head(self.wte(idx))
        return torch.nn.functional.cross_entropy(logits.view(-1, vocab_size), targets.view(-1))


model = TinyLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
iter_num = 0
if args.resume:
    checkpoint = torch.load(args.resume)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    iter_num = checkpoint["iter_num"]
    print(f"resuming from {args.resume} at iter {iter_num}")

while iter_num < args.max_steps:
    X, Y = get_batch()
    loss = model(X, Y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    iter_num += 1
    print(f"iter {iter_num}: loss {loss.item():.4f}")
    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num}
    torch.save(checkpoint, os.path.join(args.out_dir, f"ckpt_{iter_num}.pt"))

torch.save(model.state_dict(), os.path.join(args.out_dir, "final.pt"))
