"""What the CPU can do, as the kernel reports it: the ISA flags that decide how fast bf16 trains.

amx_bf16 (Intel AMX tiles) runs bf16 matmuls several times faster than fp32; avx512_bf16 only converts
and dots bf16 in vector registers, which on the CPUs measured here is slower than fp32 (bench section b).
"""

from pathlib import Path

import torch

ISA_FLAGS = ("amx_bf16", "avx512_bf16", "avx512f")  # the ones every performance figure is printed with


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The first CPU's flags; empty where /proc/cpuinfo is absent (not Linux) or unreadable."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def isa_summary(flags: set[str] | None = None) -> str:
    """'amx_bf16 no, avx512_bf16 yes, avx512f yes': printed next to every figure."""
    flags = cpu_flags() if flags is None else flags
    return ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in ISA_FLAGS)


def resolve_precision(precision: str, device: str, flags: set[str] | None = None) -> str:
    """precision: auto is bf16 where bf16 pays (a CPU with AMX, a GPU that has bf16), else fp32."""
    if precision != "auto":
        return precision
    if device == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if "amx_bf16" in (cpu_flags() if flags is None else flags) else "fp32"
