"""The training program section j puts under certify: the default config's MiniMind model, 1 thread, random
token batches from a generator of its own, AdamW, a checkpoint every --save-every steps (the model, AdamW,
the step, the batch generator's state). --forget generator resumes without the generator's state, as a buggy
script would: certify says not exact at the first resumed step.

  python bench/lanes_loop.py --out DIR --steps N [--save-every K] [--resume DIR/step_K.pt [--forget generator]]
"""

import argparse
from pathlib import Path

import torch
from common import BATCH, LR, SEQ, model_config

from mmkit.atomic import write_atomic
from mmkit.model import MiniMindForCausalLM


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--save-every", type=int, default=0)
    p.add_argument("--resume")
    p.add_argument("--forget", choices=("generator",))
    args = p.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)  # before the model: the resumed run builds the same weights before loading
    model = MiniMindForCausalLM(model_config("default")).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    batches = torch.Generator().manual_seed(1)
    step, out = 0, Path(args.out)
    if args.resume:
        state = torch.load(args.resume, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        if args.forget != "generator":
            batches.set_state(state["batches"])
    out.mkdir(parents=True, exist_ok=True)
    while step < args.steps:
        x, y = (torch.randint(0, model.config.vocab_size, (BATCH, SEQ), generator=batches) for _ in range(2))
        loss = model(x, y)[1]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if args.save_every and step % args.save_every == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                     "batches": batches.get_state()}
            write_atomic(out / f"step_{step}.pt", lambda f: torch.save(state, f))


if __name__ == "__main__":
    main()
