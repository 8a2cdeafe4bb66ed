"""i. certify's recorder: a training step with its hooks on against the same step without, side by side,
on the default config's model (the recorder's budget is 10% of a step), and the digest's speed beside sha1's.
"""

import hashlib
import tempfile
import time

import numpy as np
import torch
from common import BATCH, LR, SEQ, config_of, model_config, paired_ratio, summary, time_interleaved
from step import train_step_fn

from certkit import digest
from certkit.recorder import Recorder
from mmkit.model import MiniMindForCausalLM
from mmkit.train import ADAMW_KERNELS, WEIGHT_DECAY

DIMS = "default"


def bench_certify_overhead(reps: int, warmup: int) -> list:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = MiniMindForCausalLM(model_config(DIMS)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY,
                                  **ADAMW_KERNELS[config_of(DIMS)["adamw"]])
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, model.config.vocab_size, (BATCH, SEQ), generator=gen) for _ in range(2))
    step = train_step_fn(model, optimizer, x, y, "fp32", False)
    with tempfile.TemporaryDirectory() as folder:
        recorder = Recorder(folder)

        def recorded():
            recorder.install()
            try:
                step()
            finally:
                recorder.remove()

        times = time_interleaved({"plain": step, "recorded": recorded}, reps, warmup, label="certify recorder")
    rows = [{"section": "certify", "what": name, "dims": DIMS, "precision": "fp32", "threads": 1, **summary(t),
             "vs_plain_paired": paired_ratio(t, times["plain"])} for name, t in times.items()]
    # what the recorder digests each step: the parameters, their gradients, AdamW's two moments
    state = [p.detach() for p in model.parameters()] * 4
    nbytes = sum(t.numel() * t.element_size() for t in state)
    for name, fn in (("multilinear", lambda: digest.of_tensors(state)),
                     ("sha1", lambda: [hashlib.sha1(np.ascontiguousarray(t.numpy()).data).digest() for t in state])):
        seconds = min(_once(fn) for _ in range(max(reps, 3)))
        rows.append({"section": "certify", "what": f"digest {name}", "dims": DIMS, "mb_per_step": nbytes / 1e6,
                     "gb_per_s": nbytes / seconds / 1e9, "median_ms": seconds * 1e3})
    return rows


def _once(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
