"""What the CPU can do, as the kernel reports it: the ISA flags that decide how fast bf16 trains.

amx_bf16 (Intel AMX tiles) runs bf16 matmuls several times faster than fp32. avx512_bf16 (bf16 dot products
in vector registers) was measured both ways: on AMD EPYC bf16 matmuls ran 2.2x the fp32 rate and a
MiniMind2-small step took 0.61x the fp32 step; on Intel without AMX the bf16 step was 1.7x slower (bench
section b). So precision: auto is bf16 on AMX, and on AMD with avx512_bf16.
"""

from pathlib import Path

import torch

ISA_FLAGS = ("amx_bf16", "avx512_bf16", "avx512f")  # the ones every performance figure is printed with


def cpuinfo_field(name: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The first CPU's NAME line of /proc/cpuinfo (flags, vendor_id); empty where it is absent (not Linux)
    or unreadable."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith(name)), "")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    return set(cpuinfo_field("flags", cpuinfo).split())


def cpu_vendor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """GenuineIntel, AuthenticAMD, ...; empty where /proc/cpuinfo says nothing."""
    return cpuinfo_field("vendor_id", cpuinfo)


def isa_summary(flags: set[str] | None = None) -> str:
    """'amx_bf16 no, avx512_bf16 yes, avx512f yes': printed next to every figure."""
    flags = cpu_flags() if flags is None else flags
    return ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in ISA_FLAGS)


def resolve_precision(precision: str, device: str, flags: set[str] | None = None, vendor: str | None = None) -> str:
    """precision: auto is bf16 where bf16 was measured faster (a CPU with AMX, an AMD CPU with avx512_bf16, a GPU
    that has bf16), else fp32. From the flags and vendor alone, so one machine always decides the same."""
    if precision != "auto":
        return precision
    if device == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    flags = cpu_flags() if flags is None else flags
    vendor = cpu_vendor() if vendor is None else vendor
    faster = "amx_bf16" in flags or (vendor == "AuthenticAMD" and "avx512_bf16" in flags)
    return "bf16" if faster else "fp32"
