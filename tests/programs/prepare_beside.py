"""A nanoGPT-style script: on its first run it tokenizes its text into train.bin beside itself (as nanoGPT's
data/*/prepare.py does), then trains on random windows of it read through np.memmap, and saves
{out_dir}/ckpt_{iter}.pt. Every later run finds train.bin there and reads it. Not this project's code."""
import os
import sys

import numpy as np
import torch

here = os.path.dirname(os.path.abspath(__file__))
data_path = os.path.join(here, "train.bin")
if not os.path.exists(data_path):
    text = "the cat sat on the mat and the dog ran under the log " * 40
    np.array([ord(c) % 32 for c in text], dtype=np.uint16).tofile(data_path)

out_dir = sys.argv[sys.argv.index("--out_dir") + 1]
max_iters = 8
block_size, batch_size = 8, 4
torch.manual_seed(1337)
model = torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Linear(16, 32))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
generator = torch.Generator().manual_seed(1337)
iter_num = 0
if "--resume" in sys.argv:
    checkpoint = torch.load(sys.argv[sys.argv.index("--resume") + 1], weights_only=True)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    generator.set_state(checkpoint["generator"])
    iter_num = checkpoint["iter_num"]


def get_batch():
    data = np.memmap(data_path, dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
    return x, y


os.makedirs(out_dir, exist_ok=True)
while iter_num < max_iters:
    x, y = get_batch()
    loss = torch.nn.functional.cross_entropy(model(x).view(-1, 32), y.view(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    iter_num += 1
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "generator": generator.get_state(), "iter_num": iter_num},
               os.path.join(out_dir, f"ckpt_{iter_num}.pt"))
torch.save(model.state_dict(), os.path.join(out_dir, "final.pt"))
