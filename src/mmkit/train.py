"""The one training loop every training artifact runs, and the one place model and optimizer are built."""

import contextlib
import dataclasses
import math
import os
import sys
import time

import torch

from . import fingerprint
from .config import RunConfig, load_config, run_config
from .data import StepPlan, TrainingData
from .errors import NonFiniteError, UserError
from .hardware import cpu_vendor, isa_summary, resolve_precision
from .model import MiniMindForCausalLM
from .parallel import Ranks
from .checkpoint.entries import TrainingState

WEIGHT_DECAY = 0.01
# evaluation (half-precision logits, val loss) runs on 1 thread, so its numbers depend on the weights
# alone and not on the thread count that trained them
EVAL_THREADS = 1
GRAD_CLIP = 1.0
# AdamW's three implementations: the same update, summed in other orders, so each has its own last bits
ADAMW_KERNELS = {"fused": {"fused": True}, "foreach": {"foreach": True}, "forloop": {"foreach": False}}


def lr_at(step: int, total_steps: int, lr: float) -> float:
    """MiniMind's cosine from the absolute step (1-based) and the TOTAL steps: never restarted on resume."""
    return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * step / total_steps)))


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("config key 'device' is cuda but this torch sees no CUDA device; use cpu or auto")
    return device


def configure(config, stop_at, options):
    """(a job's settings from the file CONFIG, the step it stops after or None, its device), the process made
    deterministic. STOP_AT: run.py's --stop-at ("config": the file's stop_at); OPTIONS: its ResumeOptions."""
    settings = load_config(config)
    cfg = run_config(settings)
    stop_at = settings.stop_at if stop_at == "config" else stop_at
    if options.replays_an_epoch and cfg.data_format == "windows":
        raise UserError("--replay replays an epoch: it needs data.format minimind (the windows format has no "
                        "epochs; --no-skip rewinds it)")
    device = make_deterministic(cfg)
    cfg = resolve_auto_precision(cfg, device)  # once: the fingerprint, the timing and the report get the result
    return cfg, stop_at, device


def make_deterministic(cfg: RunConfig) -> str:
    """Pin everything that changes the last bits between two processes; returns the device used."""
    device = resolve_device(cfg.device)
    # the same reduction order needs the same thread count: 1 and 2 threads differ in the last bits
    torch.set_num_threads(cfg.threads)
    if device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts
        torch.backends.cudnn.benchmark = False
        # CUDA has atomics-based kernels that differ run to run; this makes them refuse or pick another.
        # Not set on CPU, whose kernels are deterministic for a fixed thread count (the tests compare
        # separate processes bit for bit) and where the call costs 1.5 s of importing torch._inductor.
        torch.use_deterministic_algorithms(True)
    return device


def resolve_auto_precision(cfg: RunConfig, device: str) -> RunConfig:
    """precision: auto decided, once, for this device (bf16 where the CPU computes it natively)."""
    if cfg.precision != "auto":
        return cfg
    cfg = dataclasses.replace(cfg, precision=resolve_precision(cfg.precision, device))
    print(f"precision: auto is {cfg.precision} on this {device} ({cpu_vendor()}: {isa_summary()})", file=sys.stderr,
          flush=True)
    return cfg


def build(cfg: RunConfig, device: str, ranks: Ranks, data: TrainingData) -> TrainingState:
    """Model, optimizer, batch generator, batches and loss scaler (fp16 only, else None), built identically by
    the straight and the resumed run, at step 0.

    With several ranks the model is wrapped (DDP, or sharded in place by FSDP2) before AdamW sees it.
    """
    # seed before building the model: a resumed run draws the same init even though it is overwritten,
    # so every later draw from the global RNG lines up with the straight run's (on every rank alike)
    torch.manual_seed(cfg.seed)
    model = ranks.wrap(MiniMindForCausalLM(cfg.model).to(device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=WEIGHT_DECAY, **ADAMW_KERNELS[cfg.adamw])
    # its own generator, so nothing else moves the data position; the same on every rank, unless the
    # rank0_gen ablation gives each rank its own (seed + rank) and its share of the batch, as many DDP scripts do
    own = ranks.rank_generators
    batch_generator = torch.Generator().manual_seed(cfg.seed + (ranks.rank if own else 0))
    batches = data.batches(batch_generator, cfg.batch_size // ranks.world_size if own else cfg.batch_size)
    # fp16 autocast: gradients scaled up so small ones survive fp16, and a step skipped on overflow
    if cfg.precision == "fp16" and not torch.amp.is_autocast_available(device):
        raise UserError(f"config key 'precision': fp16 autocast is not available on {device} in torch {torch.__version__}")
    scaler = torch.amp.GradScaler(device) if cfg.precision == "fp16" else None
    return TrainingState(model, optimizer, batch_generator, batches, scaler, ranks,
                         fingerprint.build(cfg, device, data.sha256, ranks))


AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # fp32: no autocast


def autocast(cfg: RunConfig, device: str):
    if cfg.precision in AUTOCAST_DTYPES:
        return torch.autocast(device_type=device, dtype=AUTOCAST_DTYPES[cfg.precision])
    return contextlib.nullcontext()


def train(cfg: RunConfig, device, live: TrainingState, plan: StepPlan, last_step: int, schedule_offset: int = 0):
    """Optimizer steps live.step + 1 .. last_step (1-based, inclusive) on LIVE; yields each step once LIVE
    holds its result (step, loss log, skipped steps).

    Each step reads plan.micro_batches(step) batches from BATCHES (accumulation_steps of them, fewer for an
    epoch's trailing step), each with its own LR from its micro-batch number, as MiniMind sets it. Each
    rank trains on its slices of a batch (ranks.micro_batches), accumulating their gradients; loss is the
    mean over all micro-batches and slices, the same number on every rank.

    update() then takes the optimizer step, or skips it (a non-finite loss, an fp16 overflow), counted in
    live.skipped_steps. schedule_offset > 0 reproduces a known bug (the LR schedule counted from 0 again on
    resume, in micro-batches): only the nosched ablation sets it.
    """
    model, optimizer, scaler, ranks, batches = live.model, live.optimizer, live.scaler, live.ranks, iter(live.batches)
    model.train()
    total, first_step = plan.consumed(cfg.steps), live.step + 1
    for step in range(first_step, last_step + 1):
        t0 = time.perf_counter()
        micro_steps = plan.micro_batches(step)
        loss = 0.0
        for k, micro in enumerate(micro_steps):
            lr = lr_at(micro - schedule_offset, total, cfg.lr)
            for group in optimizer.param_groups:
                group["lr"] = lr
            slices = ranks.micro_batches(*next(batches))
            for i, (x, y) in enumerate(slices):
                last = k == len(micro_steps) - 1 and i == len(slices) - 1
                with ranks.grad_sync(model, last=last), autocast(cfg, device):
                    micro_loss = model(x.to(device), y.to(device))[1]  # the logits die here, before backward
                # scaled only when it changes something: one batch on one rank stays the plain loop, bit for bit
                scaled = micro_loss * ranks.loss_scale if ranks.loss_scale != 1 else micro_loss
                scaled = scaled / cfg.accumulation_steps if cfg.accumulation_steps != 1 else scaled  # MiniMind's
                (scaler.scale(scaled) if scaler else scaled).backward()
                loss += micro_loss.item() / ranks.slices / len(micro_steps)
        loss = ranks.sum(loss)
        skipped = update(cfg, step, loss, model, optimizer, scaler)
        ms = (time.perf_counter() - t0) * 1000
        if ranks.main:
            print(f"step {step:>4}/{cfg.steps}  loss {loss:.6f}  lr {lr:.3e}  {ms:.0f} ms"
                  + (f"  skipped: {skipped}" if skipped else ""), file=sys.stderr, flush=True)
        live.step, live.skipped_steps = step, live.skipped_steps + (skipped is not None)
        live.loss_log.append((step, loss))
        yield step


def update(cfg: RunConfig, step: int, loss: float, model, optimizer, scaler) -> str | None:
    """The optimizer step on the gradients accumulated, clipped; returns why it was skipped (None: taken).

    A non-finite loss or gradient norm stops the run (NonFiniteError), or with nonfinite: skip leaves the
    weights and AdamW untouched. Under fp16 the GradScaler skips a step whose scaled gradients overflowed."""
    if scaler:
        scaler.unscale_(optimizer)
    grad_norm = total_norm(torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP))
    overflow = scaler is not None and not math.isfinite(grad_norm)  # the scaler's to handle
    finite = math.isfinite(loss) and (math.isfinite(grad_norm) or overflow)
    if not finite and cfg.nonfinite == "stop":
        raise NonFiniteError(f"step {step}: loss {loss}, gradient norm {grad_norm}"
                             f"{first_nonfinite_grad(model)}; stopped before the update, nothing written")
    if scaler:
        if finite:
            scaler.step(optimizer)  # skips the update when unscale_ found an overflow
        scaler.update()
    elif finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if not finite:
        return "non-finite"
    return f"fp16 overflow, loss scale now {scaler.get_scale():g}" if overflow else None


def total_norm(norm) -> float:
    """clip_grad_norm_'s result as a float; under FSDP2 it is a DTensor, summed shard by shard."""
    return (norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item()


def first_nonfinite_grad(model) -> str:
    for name, p in model.named_parameters():
        if p.grad is not None and not torch.isfinite(p.grad).all():
            return f" (first non-finite gradient: {name})"
    return ""


@torch.no_grad()
def logits_on(model, tokens) -> torch.Tensor:
    model.eval()
    idx = torch.as_tensor(tokens.astype("int64"))[None]
    return model(idx)[0][0].float()


@torch.no_grad()
def eval_loss(model, tokens, seq_len: int) -> float:
    """Mean next-token loss over consecutive seq_len windows of tokens (the held-out val set)."""
    model.eval()
    ids = torch.as_tensor(tokens.astype("int64"))
    n = (len(ids) - 1) // seq_len
    x = ids[: n * seq_len].view(n, seq_len)
    y = ids[1 : n * seq_len + 1].view(n, seq_len)
    losses = [model(x[i : i + 8], y[i : i + 8])[1].item() * len(x[i : i + 8]) for i in range(0, n, 8)]
    return sum(losses) / n
