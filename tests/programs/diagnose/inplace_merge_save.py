"""Train a LoRA-style adapter (base Linear plus low-rank A, B) and every 2 steps also export merged
weights. The export merges into base.weight.detach().cpu(), which on CPU is the live weight itself,
so each export silently changes the model being trained; a resume restores the unmerged weights.
"""
import argparse
import os

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--max_steps", type=int, default=8)
parser.add_argument("--rank", type=int, default=4)
parser.add_argument("--resume", default=None)
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
os.makedirs(args.out_dir, exist_ok=True)


class LoRALinear(torch.nn.Module):
    def __init__(self, d_in, d_out, rank, alpha=8):
        super().__init__()
        self.base = torch.nn.Linear(d_in, d_out)
        self.A = torch.nn.Parameter(torch.randn(rank, d_in) * 0.1)
        self.B = torch.nn.Parameter(torch.randn(d_out, rank) * 0.1)
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + x @ self.A.T @ self.B.T * self.scale


model = LoRALinear(16, 8, args.rank)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
g = torch.Generator().manual_seed(11)
target = torch.randn(8, 16, generator=g)

step = 0
if args.resume:
    ckpt = torch.load(args.resume)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    g.set_state(ckpt["data_rng"])
    step = ckpt["step"]
    print(f"resumed from {args.resume} at step {step}")


def save(step):
    ckpt = {"model": {k: v.clone() for k, v in model.state_dict().items()},
            "optimizer": optimizer.state_dict(), "step": step, "data_rng": g.get_state()}
    torch.save(ckpt, os.path.join(args.out_dir, f"ckpt_{step}.pt"))
    if step % 2 == 0:  # export merged weights for inference
        with torch.no_grad():
            w = model.base.weight.detach().cpu()
            w += (model.B @ model.A) * model.scale
        torch.save({"weight": w, "bias": model.base.bias.detach().cpu()},
                   os.path.join(args.out_dir, f"merged_{step}.pt"))


while step < args.max_steps:
    x = torch.randn(32, 16, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), x @ target.T)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    print(f"step {step} loss {loss.item():.4f}")
    save(step)

torch.save(model.state_dict(), os.path.join(args.out_dir, "final.pt"))
