# A small training script, written as quick experiment scripts are: a linear model fit with SGD on fixed
# random data, a checkpoint every --save_every steps (ckpt_0004.pt: zero-padded), --resume to continue from
# one. --uploader starts a helper that uploads metrics in the background and outlives the script (it forks
# twice and leaves the session, as a daemon does); --notes is free text stored with nothing.
import argparse
import os
import sys


def start_uploader(name):
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", name])
        os._exit(0)
    os.waitpid(pid, 0)
    print(f"uploader {name} started", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save_every", type=int, default=1)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--uploader", default=None)
    parser.add_argument("--notes", action="append", default=[])
    args = parser.parse_args()
    if args.uploader:
        start_uploader(args.uploader)

    import torch  # slow to import: only once the arguments are fine

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    step = 0
    if args.resume:
        ckpt = torch.load(args.resume)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        step = ckpt["step"]
        print(f"resumed from {args.resume} at step {step}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    while step < args.steps:
        i = step % 4
        loss = torch.nn.functional.mse_loss(model(x[i * 8:(i + 1) * 8]), y[i * 8:(i + 1) * 8])
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        if step % args.save_every == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                       os.path.join(args.out, f"ckpt_{step:04d}.pt"))


if __name__ == "__main__":
    main()
