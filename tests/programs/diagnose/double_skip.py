"""Fine-tune a small regression model on one long pass over a token-free dataset, checkpointing every step.
On resume it starts the data at the saved position (a Subset from the first unseen sample) and then skips the
batches already trained on as well, as a loop that grew a second resume path does: the resumed run skips
ahead by as many batches as it had trained.
"""
import argparse
import os

import torch
from torch.utils.data import DataLoader, Subset, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--max_steps", type=int, default=12)
parser.add_argument("--batch_size", type=int, default=4)
parser.add_argument("--resume", default=None)
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
os.makedirs(args.out_dir, exist_ok=True)

inputs = torch.randn(32 * args.batch_size, 8)
targets = inputs @ torch.randn(8, 1)
dataset = TensorDataset(inputs, targets)

model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)

step = 0
if args.resume:
    ckpt = torch.load(args.resume)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    step = ckpt["step"]
    dataset = Subset(dataset, range(step * args.batch_size, len(dataset)))  # start where the run stopped
    print(f"resumed from {args.resume} at step {step}")
loader = DataLoader(dataset, batch_size=args.batch_size)

for i, (x, y) in enumerate(loader):
    if i < step:  # batches already trained before the resume
        continue
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
               os.path.join(args.out_dir, f"ckpt_{step}.pt"))
    if step >= args.max_steps:
        break
