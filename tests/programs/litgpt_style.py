# A pretraining script in the style of litgpt's pretrain.py: it measures the model's FLOPs on a copy built on
# the meta device (forward and backward in grad mode, as litgpt's measure_flops does), then trains and saves
# step-{N}/lit_model.pth every step. Written as such scripts are, not as this project writes its own.
import argparse
import os
import sys

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode


class Block(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.ln = nn.LayerNorm(n_embd)
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return x + self.proj(torch.nn.functional.gelu(self.fc(self.ln(x))))


class GPT(nn.Module):
    def __init__(self, vocab=64, n_embd=32, n_layer=2):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd) for _ in range(n_layer))
        self.lm_head = nn.Linear(n_embd, vocab)

    def forward(self, idx):
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(x)


def measure_flops(model, x):
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    return counter.get_total_flops()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--max_steps", type=int, default=8)
    parser.add_argument("--save_dtype", default="float32", help="float16 halves the checkpoint")
    args = parser.parse_args()

    torch.manual_seed(1337)
    torch.set_num_threads(1)
    with torch.device("meta"):
        meta_model = GPT()
        x = torch.randint(0, 1, (4, 16))
        print(f"Measured TFLOPs: {measure_flops(meta_model, x) / 1e12:.6f}")
        del meta_model, x

    model = GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    data = torch.randint(0, 64, (64, 17), generator=torch.Generator().manual_seed(42))
    step = 0
    if args.resume:
        state = torch.load(args.resume, weights_only=True)
        model.load_state_dict({k: v.float() for k, v in state["model"].items()})
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    while step < args.max_steps:
        batch = data[(step * 4) % 64:(step * 4) % 64 + 4]
        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 64), batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        folder = os.path.join(args.out_dir, f"step-{step}")
        os.makedirs(folder, exist_ok=True)
        dtype = getattr(torch, args.save_dtype)
        torch.save({"model": {k: v.to(dtype) for k, v in model.state_dict().items()},
                    "optimizer": optimizer.state_dict(), "step": step}, os.path.join(folder, "lit_model.pth"))
        print(f"iter {step}: loss {loss.item():.4f}", file=sys.stderr)
    torch.save(model.state_dict(), os.path.join(args.out_dir, "final.pth"))


if __name__ == "__main__":
    main()
