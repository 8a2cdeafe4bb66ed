# Saves its checkpoints from a background thread into ./checkpoints (relative to where it is run, no
# per-run folder), a second after each step, so as not to hold up training.
import sys
import threading
import time

import torch

resume = sys.argv[sys.argv.index("--resume") + 1] if "--resume" in sys.argv else None
torch.manual_seed(0)
torch.set_num_threads(1)
net = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
step = 0
if resume:
    state = torch.load(resume, weights_only=True)
    net.load_state_dict(state["net"])
    opt.load_state_dict(state["opt"])
    step = state["step"]


def save_later(state, path):
    time.sleep(1.0)
    torch.save(state, path)


import os  # noqa: E402

os.makedirs("checkpoints", exist_ok=True)
x = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))
while step < 8:
    loss = net(x[step * 4:(step + 1) * 4]).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    state = {"net": {k: v.clone() for k, v in net.state_dict().items()}, "opt": opt.state_dict(), "step": step}
    threading.Thread(target=save_later, args=(state, f"checkpoints/ckpt_{step}.pt")).start()
torch.save(net.state_dict(), "checkpoints/final.pt")
