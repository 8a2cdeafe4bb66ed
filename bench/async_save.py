"""How long saving the resume directory blocks an FSDP2 run: dcp.save against dcp.async_save.

  torchrun --standalone --nproc-per-node 2 bench/async_save.py --out bench/async_save.md [--dims minimind2-small]

Two ranks on gloo, the model sharded by FSDP2 with AdamW's state filled by one step. Each round saves the
same state both ways, in alternating order, through mmkit.checkpoint.dcp (the code run.py uses):
  blocked    from the call until the training loop could go on (sync: the save is done and committed;
             async: the shards are staged and handed to the background writer)
  committed  from the call until the directory is renamed into place
Ratios compare medians measured in this run.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import torch  # noqa: E402
import yaml  # noqa: E402

from mmkit.data import DataPosition  # noqa: E402
from mmkit.model import MiniMindForCausalLM, ModelConfig  # noqa: E402
from mmkit.parallel import ParallelConfig, start  # noqa: E402
from mmkit.checkpoint.entries import TrainingState, resume_state  # noqa: E402
from mmkit.checkpoint.dcp import save_resume_dir  # noqa: E402
from mmkit.train import WEIGHT_DECAY  # noqa: E402

ISA_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2")


def cpu_flags() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            have = set(line.split(":", 1)[1].split())
            return ", ".join(f if f in have else f"no {f}" for f in ISA_FLAGS)
    return "unknown"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--dims", default=str(ROOT / "presets" / "minimind2-small.yaml"))
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()

    torch.set_num_threads(1)
    ranks = start(ParallelConfig(world_size=int(os.environ.get("WORLD_SIZE", 1)), strategy="fsdp2"), "cpu")
    torch.manual_seed(0)
    dims = ModelConfig(**yaml.safe_load(Path(args.dims).read_text())["model"])
    model = ranks.wrap(MiniMindForCausalLM(dims))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=WEIGHT_DECAY)
    x = torch.randint(0, dims.vocab_size, (2, 65), generator=torch.Generator().manual_seed(ranks.rank))
    model(x[:, :-1], x[:, 1:])[1].backward()
    optimizer.step()
    gen = torch.Generator().manual_seed(0)

    times = {"sync": {"blocked": [], "committed": []}, "async": {"blocked": [], "committed": []}}
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
        path = Path(tmp) / "resume.dcp"
        if ranks.main:
            print(f"saving {sum(p.numel() for p in model.parameters()):,} parameters + AdamW state, "
                  f"{args.rounds} rounds", file=sys.stderr)
        for r in range(args.rounds + 1):  # round 0 warms up both
            for mode in ("sync", "async") if r % 2 == 0 else ("async", "sync"):
                batches = DataPosition(gen, {"epoch": 0, "batch": 1})
                state = resume_state(TrainingState(model, optimizer, gen, batches, None, ranks, {"bench": True}, step=1))
                ranks.barrier()
                t0 = time.perf_counter()
                pending = save_resume_dir(state, path, ranks, async_save=mode == "async")
                if mode == "sync":
                    pending.commit()
                blocked = time.perf_counter() - t0
                pending.commit() if mode == "async" else None
                committed = time.perf_counter() - t0
                if r:
                    times[mode]["blocked"].append(blocked)
                    times[mode]["committed"].append(committed)
                if ranks.main:
                    print(f"round {r} {mode}: blocked {blocked * 1e3:.0f} ms, committed {committed * 1e3:.0f} ms",
                          file=sys.stderr)
        size = sum(f.stat().st_size for f in path.iterdir()) if ranks.main else 0
    med = {m: {k: statistics.median(v) for k, v in t.items()} for m, t in times.items()}
    ratio = med["async"]["blocked"] / med["sync"]["blocked"]
    if ranks.main:
        Path(args.out).write_text("\n".join([
            "# Async save: how long the loop is blocked",
            "",
            f"FSDP2, {ranks.world_size} ranks (gloo), MiniMind2-small dims from {Path(args.dims).name}, "
            f"resume directory {size / 1e6:.1f} MB; median of {args.rounds} rounds, sync and async alternated.",
            f"CPU flags: {cpu_flags()}; {os.cpu_count()} logical CPUs; torch {torch.__version__}.",
            "",
            "| save | blocked (ms) | committed (ms) |",
            "|---|---|---|",
            f"| dcp.save | {med['sync']['blocked'] * 1e3:.0f} | {med['sync']['committed'] * 1e3:.0f} |",
            f"| dcp.async_save | {med['async']['blocked'] * 1e3:.0f} | {med['async']['committed'] * 1e3:.0f} |",
            "",
            f"Blocked by an async save: **{ratio:.2f}×** the synchronous save (target ≤ 0.30).",
            "",
        ]))
        print(f"async blocked / sync blocked = {ratio:.3f}", file=sys.stderr)
    ranks.close()


if __name__ == "__main__":
    main()
