"""What every benchmark section shares: the dims it measures, the machine it ran on, how it times."""

import os
import platform
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import torch  # noqa: E402
import yaml  # noqa: E402

from mmkit.hardware import cpu_vendor, isa_summary  # noqa: E402
from mmkit.model import ModelConfig  # noqa: E402

BATCH, SEQ, LR = 8, 128, 3.0e-3
NOISY_IQR_PCT = 25  # a spread above this flags a measurement as disturbed by other work on the machine
TARGET_DIMS = "minimind2-small"  # the targets are measured at MiniMind2-small's real size
DIMS_SOURCES = {  # name -> YAML files overlaid in order, as snakemake --configfile does
    "default": [ROOT / "config.yaml"],
    "minimind2-small": [ROOT / "config.yaml", ROOT / "presets" / "minimind2-small.yaml"],
}


def config_of(dims: str) -> dict:
    """config.yaml with the dims' overlay deep-merged in (what snakemake --configfile builds)."""
    cfg = {}
    for path in DIMS_SOURCES[dims]:
        for k, v in yaml.safe_load(path.read_text()).items():
            cfg[k] = {**cfg.get(k, {}), **v} if isinstance(v, dict) else v
    return cfg


def model_config(dims: str) -> ModelConfig:
    return ModelConfig(**config_of(dims)["model"])


def machine_info() -> str:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import transformers

    return (f"{cpu}, {os.cpu_count()} logical CPUs, ISA flags: {cpu_vendor()}: {isa_summary()}; torch {torch.__version__} "
            f"(CPU capability {torch.backends.cpu.get_cpu_capability()}), transformers {transformers.__version__}, "
            f"Python {platform.python_version()}")


def time_once(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def time_interleaved(candidates: dict, reps: int, warmup: int, label: str = "") -> dict:
    """Seconds per call of each candidate, run round-robin: A,B,C then C,B,A, and so on.

    Reversing the order every round gives each candidate the same average position in a round,
    so a slow drift of the machine (or a cache left warm by the previous candidate) hits all alike.
    """
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    names = list(candidates)
    times = {n: [] for n in names}
    for r in range(reps):
        for n in names if r % 2 == 0 else names[::-1]:
            times[n].append(time_once(candidates[n]))
        if label:
            done = "  ".join(f"{n} {times[n][-1] * 1e3:.0f}" for n in names)
            print(f"    {label} round {r + 1}/{reps} (ms): {done}", flush=True)
    return times


def summary(seconds: list) -> dict:
    ms = sorted(s * 1e3 for s in seconds)
    q = statistics.quantiles(ms, n=4) if len(ms) > 1 else [ms[0]] * 3
    med = statistics.median(ms)
    return {"reps": len(ms), "median_ms": med, "min_ms": ms[0], "iqr_pct": 100 * (q[2] - q[0]) / med}


def paired_ratio(a: list, b: list) -> float:
    """Median of per-round ratios a_i/b_i: the two were timed back to back in each round."""
    return statistics.median(x / y for x, y in zip(a, b))
