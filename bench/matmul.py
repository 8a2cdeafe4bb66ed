"""b. The machine's matmul rate per dtype and thread count, and each training step's share of it."""

import statistics

import torch
from common import summary, time_interleaved


def bench_matmul(n: int, threads_list, reps: int, warmup: int) -> list:
    rows = []
    gen = torch.Generator().manual_seed(0)
    a32, b32 = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
    mats = {"fp32": (a32, b32), "bf16": (a32.bfloat16(), b32.bfloat16())}
    for threads in threads_list:
        torch.set_num_threads(threads)
        times = time_interleaved({p: (lambda a=a, b=b: a @ b) for p, (a, b) in mats.items()}, reps, warmup)
        for precision, t in times.items():
            row = {"section": "matmul", "what": f"{n}x{n} @ {n}x{n}", "precision": precision, "threads": threads,
                   **summary(t), "gflop": 2 * n**3 / 1e9, "gflops": 2 * n**3 / 1e9 / statistics.median(t)}
            rows.append(row)
            print(f"[matmul] {n}x{n} {precision} {threads}t: {row['median_ms']:.1f} ms, {row['gflops']:.1f} GFLOP/s",
                  flush=True)
    return rows


def add_matmul_share(step_rows: list, matmul_rows: list) -> None:
    """A step's share = (its FLOPs ÷ the matmul rate of its dtype and threads) ÷ its time."""
    peak = {(r["precision"], r["threads"]): r["gflops"] for r in matmul_rows}
    for r in step_rows:
        if (r["precision"], r["threads"]) in peak:
            r["matmul_share"] = r["gflops"] / peak[(r["precision"], r["threads"])]
