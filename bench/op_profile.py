"""f. Where one training step's time goes, per precision: torch.profiler's operators, grouped."""

import torch
from common import TARGET_DIMS
from step import PRECISIONS, train_step_fn, twins
from torch.profiler import ProfilerActivity, profile

# operator name -> the part of a step it belongs to; the first pattern found in the name wins
PARTS = (("aten::mm", "matmul"), ("aten::addmm", "matmul"), ("aten::bmm", "matmul"),
         ("attention", "attention (SDPA)"), ("adamw", "AdamW"), ("lerp_", "AdamW"), ("addcdiv_", "AdamW"),
         ("addcmul_", "AdamW"), ("aten::sqrt", "AdamW"), ("copy_", "dtype casts (copy_)"), ("to_copy", "dtype casts (copy_)"),
         ("softmax", "loss (log_softmax, nll)"), ("nll_loss", "loss (log_softmax, nll)"),
         ("norm", "gradient clipping"))


def part_of(op: str) -> str:
    name = op.lower()
    return next((part for pattern, part in PARTS if pattern in name), "other elementwise and glue")


def bench_profile(steps: int = 2) -> list:
    torch.set_num_threads(1)
    models, opts, x, y = twins(TARGET_DIMS)
    rows = []
    for precision in PRECISIONS:
        step = train_step_fn(models["ours"], opts["ours"], x, y, precision, False)
        step()  # warm: AdamW's state and the first-call allocations are not a step's cost
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                step()
        parts, total = {}, 0.0
        for event in prof.key_averages():
            ms = event.self_cpu_time_total / 1000 / steps
            parts[part_of(event.key)] = parts.get(part_of(event.key), 0.0) + ms
            total += ms
        top = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:3]
        for part, ms in sorted(parts.items(), key=lambda kv: -kv[1]):
            rows.append({"section": "profile", "what": part, "dims": TARGET_DIMS, "precision": precision,
                         "threads": 1, "ms_per_step": ms, "share": ms / total})
        print(f"[profile] {TARGET_DIMS} {precision}: {total:.0f} ms of operators per step; "
              + ", ".join(f"{p} {ms / total:.0%}" for p, ms in sorted(parts.items(), key=lambda kv: -kv[1])[:4])
              + "; top operators: " + ", ".join(f"{e.key} {e.self_cpu_time_total / 1000 / steps:.0f} ms"
                                                for e in top), flush=True)
    return rows
