"""The fingerprint: the settings a bit-exact continuation depends on, built and compared here alone.

A resume file carries the fingerprint of the run that saved it; a run continues from it only when its own
fingerprint is the same, or with --reshard for the rank layout, or with --allow-mismatch (not bit-exact).
"""

import hashlib
import io
import sys
import tokenize
from pathlib import Path

import torch

from .errors import UserError
from .hardware import cpu_flags
from .parallel import backend_for

# the CPU features that make oneDNN take other bf16 / fp16 kernels (AMX tiles, AVX512 dot products): a requeue
# from a node with them to one without continues other sums, though ATen's capability reads the same
HALF_KERNEL_FLAGS = ("amx_bf16", "amx_fp16", "avx512_bf16", "avx512_fp16")

FORMAT_VERSION = 6  # 2: skipped_steps, digests, the weights' dtype; 3: origin and loss_log;
# 4: data_position, rng_state, scaler; 5: adamw_offset, cpu_capability, backend, code; 6: cpu_kernels, gpu

# what may differ when a run continues on another number of ranks (--reshard); anything else may not
RESHARD_KEYS = ("world_size", "strategy", "batch_slices")
# the modules whose code decides the numbers of a step (the model, the loop and its clip and LR, the batches,
# how ranks cut and sum them): a checkpoint of other code continues other arithmetic. The resume's checks
# (mmkit.checkpoint.entries) are not among them: they decide what is refused, not what is computed.
TRAINING_CODE = ("model.py", "train.py", "data.py", "parallel.py")


def code_digests() -> dict:
    """Per training module, the sha256 of its tokens less comments and blank lines: a comment edited is the
    same code, a constant changed is not."""
    digests = {}
    for name in TRAINING_CODE:
        source = (Path(__file__).parent / name).read_text()
        tokens = tokenize.generate_tokens(io.StringIO(source).readline)
        kept = "\x00".join(t.string for t in tokens if t.type not in (tokenize.COMMENT, tokenize.NL))
        digests[name] = hashlib.sha256(kept.encode()).hexdigest()[:16]
    return digests


def build(cfg, device: str, train_data_sha256: str, ranks) -> dict:
    """This run's fingerprint (cfg: a RunConfig whose precision is resolved, ranks: mmkit.parallel.Ranks)."""
    return {
        "format": FORMAT_VERSION,
        "torch": str(torch.__version__),  # a plain str: TorchVersion is not weights_only-loadable
        "threads": cfg.threads,
        "device": device,
        # the CPU kernels ATen dispatches to (ATEN_CPU_CAPABILITY, or the best the CPU has): AVX2 and AVX512
        # kernels sum in other orders, so a requeue onto another node type continues other arithmetic
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_kernels": cpu_kernels(cfg.precision, device),
        "gpu": gpu(device),
        "code": code_digests(),
        "precision": cfg.precision,  # as resolved for this machine: auto never reaches a resume file
        "adamw": cfg.adamw,
        "weights_dtype": "float32",  # master weights: a resume file in half precision is not this run's
        "nonfinite": cfg.nonfinite,
        "model": cfg.model.to_dict(),
        "seed": cfg.seed,
        "steps": cfg.steps,
        "batch_size": cfg.batch_size,
        "seq_len": cfg.seq_len,
        "lr": cfg.lr,
        "accumulation_steps": cfg.accumulation_steps,
        "data_format": cfg.data_format,
        # the training data as read: the token file, or the JSONL and the tokenizer
        "train_data_sha256": train_data_sha256,
        # how the global batch is cut and summed; only --reshard continues under another world size
        "world_size": ranks.world_size,
        "strategy": ranks.strategy,
        "batch_slices": ranks.slices,
        "backend": backend_for(cfg.parallel, device),  # its collectives sum in their own order
        "rank_generators": ranks.rank_generators,
    }


def cpu_kernels(precision: str, device: str) -> list[str]:
    """The CPU features that choose this run's half-precision kernels: none for fp32, or off the CPU."""
    if device != "cpu" or precision == "fp32":
        return []
    return sorted(set(HALF_KERNEL_FLAGS) & cpu_flags())


def gpu(device: str) -> str | None:
    """On CUDA, what decides its kernels: the GPU, the CUDA and cuDNN versions, deterministic algorithms."""
    if not device.startswith("cuda"):
        return None
    return (f"{torch.cuda.get_device_name()}; CUDA {torch.version.cuda}; cuDNN {torch.backends.cudnn.version()}; "
            f"deterministic algorithms {torch.are_deterministic_algorithms_enabled()}")


def check_format(saved: dict, source: str) -> None:
    if saved.get("format") != FORMAT_VERSION:
        raise UserError(f"{source} has format {saved.get('format')}, this code reads {FORMAT_VERSION}")


def check(saved: dict, current: dict, source: str, allow_mismatch: bool = False, reshard: bool = False) -> None:
    """Refuse a resume made under other settings, unless allow_mismatch (or reshard, for the rank layout)."""
    diffs = diff(saved, current)
    layout = [d for d in diffs if d.split()[0] in RESHARD_KEYS]
    other = [d for d in diffs if d not in layout]
    if layout and not (reshard or allow_mismatch):
        raise UserError(f"{source} was saved with another rank layout: {'; '.join(layout)} "
                        "(pass --reshard to continue it on this one)")
    if other and not allow_mismatch:
        raise UserError(
            f"{source} was made under other settings: {'; '.join(other)} "
            "(rerun with the same settings, or pass --allow-mismatch and lose bit-exactness)"
        )
    if layout:
        exact = saved.get("batch_slices") == current.get("batch_slices")
        print(f"resume: resharding ({'; '.join(layout)}): "
              + ("the same batch slices, so the same sums: bit-exact" if exact else
                 "other batch slices, so gradients are summed in another order: not bit-exact"), file=sys.stderr)
    if other:
        print(f"warning: resuming despite {'; '.join(other)}: the result will not be bit-exact", file=sys.stderr)


def diff(saved: dict, current: dict, prefix: str = "") -> list[str]:
    """Every key whose value differs, nested keys as model.hidden_size."""
    diffs = []
    for k in sorted(set(saved) | set(current)):
        a, b = saved.get(k), current.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += diff(a, b, f"{prefix}{k}.")
        elif a != b:
            diffs.append(f"{prefix}{k} {a} in the file, {b} now")
    return diffs
