"""g. The step's options, each against the configured step, side by side: which ones pay on this machine.

Kept in the project only when they pay: AdamW's kernel (`adamw`) and the written-out attention
(`model.flash_attn: false`) are settings; torch.compile is measured here, with its compile time apart.
"""

import dataclasses
import time

import torch
from common import LR, TARGET_DIMS, config_of, paired_ratio, summary, time_interleaved
from step import PRECISIONS, train_step_fn, twins

from mmkit.model import MiniMindForCausalLM
from mmkit.train import ADAMW_KERNELS, WEIGHT_DECAY


def variant(ours, adamw: str, **model_changes):
    """A copy of OURS with other model settings and AdamW kernel, holding the same weights."""
    model = MiniMindForCausalLM(dataclasses.replace(ours.config, **model_changes))
    model.load_state_dict(ours.state_dict())
    model.train()
    return model, torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, **ADAMW_KERNELS[adamw])


def bench_options(reps: int, warmup: int, compile_model: bool = True) -> list:
    torch.set_num_threads(1)
    models, opts, x, y = twins(TARGET_DIMS)
    ours, configured = models["ours"], config_of(TARGET_DIMS)["adamw"]
    others = {f"adamw: {k}": variant(ours, k) for k in ADAMW_KERNELS if k != configured}
    others[f"flash_attn: {not ours.config.flash_attn}"] = variant(ours, configured, flash_attn=not ours.config.flash_attn)
    rows = []
    for precision in PRECISIONS:
        candidates = {"configured": train_step_fn(ours, opts["ours"], x, y, precision, False)}
        candidates.update({name: train_step_fn(m, o, x, y, precision, False) for name, (m, o) in others.items()})
        compile_s = None
        if compile_model:
            model, optimizer = variant(ours, configured)
            compiled = torch.compile(model)
            t0 = time.perf_counter()
            train_step_fn(compiled, optimizer, x, y, precision, False)()  # the first call compiles
            compile_s = time.perf_counter() - t0
            candidates["torch.compile"] = train_step_fn(compiled, optimizer, x, y, precision, False)
        times = time_interleaved(candidates, reps, warmup, label=f"options {precision}")
        for name, t in times.items():
            row = {"section": "options", "what": name, "dims": TARGET_DIMS, "precision": precision, "threads": 1,
                   **summary(t), "vs_configured_paired": paired_ratio(t, times["configured"])}
            if name == "torch.compile":
                row["compile_s"] = compile_s
            rows.append(row)
            print(f"[options] {precision} {name:>18}: {row['median_ms']:.0f} ms, ÷ configured "
                  f"{row['vs_configured_paired']:.3f}" + (f", compiled in {compile_s:.1f} s" if compile_s and
                                                           name == "torch.compile" else ""), flush=True)
    return rows
