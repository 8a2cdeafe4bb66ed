"""Side-by-side CPU benchmark of this project's training step, matmul rate and checkpoint I/O.

  python bench/bench.py --out-csv bench/results.csv --out-md bench/results.md [--quick]

Measures, in one process, with candidates interleaved so that drift on a shared machine hits all of them:
  a. one training step (forward, backward, clip_grad_norm 1.0, AdamW step, zero_grad; batch 8 x seq 128)
     of mmkit's MiniMindForCausalLM vs transformers' LlamaForCausalLM holding the SAME weights,
     at the config.yaml dims and the MiniMind2-small dims, fp32 and bf16 autocast, 1 and 2 threads
  b. the fp32 and bf16 matmul rate at 1 and 2 threads, and each step's achieved share of it
  c. save_atomic vs plain torch.save vs raw `dd ... conv=fsync` for a resume-file-sized dict,
     and torch.load(weights_only=True) with and without mmap=True
  d. the whole DAG's wall time (snakemake on a fresh copy of the workflow, default config, --cores 1
     and --cores 2) vs the sum of its training steps (timing/*.json): the rest is overhead
Every figure is the median of repeated runs; every ratio compares figures taken in this same run.
"""

import argparse
import csv
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))  # mmkit, wherever the script is run from

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import yaml  # noqa: E402

from mmkit.checkpoint import global_rng_state, resume_state, save_atomic  # noqa: E402
from mmkit.model import MiniMindForCausalLM, ModelConfig  # noqa: E402
from mmkit.train import GRAD_CLIP, WEIGHT_DECAY, lr_at  # noqa: E402

BATCH, SEQ, LR = 8, 128, 3.0e-3
NOISY_IQR_PCT = 25  # a spread above this flags a measurement as disturbed by other work on the machine
DIMS_SOURCES = {  # name -> YAML files whose 'model' keys are overlaid in order, as snakemake --configfile does
    "default": [ROOT / "config.yaml"],
    "minimind2-small": [ROOT / "config.yaml", ROOT / "presets" / "minimind2-small.yaml"],
}


# --- timing helpers ---------------------------------------------------------------------------


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


# --- a. the training step: ours vs transformers' Llama ------------------------------------------


def model_config(dims: str) -> ModelConfig:
    model = {}
    for path in DIMS_SOURCES[dims]:
        model.update(yaml.safe_load(path.read_text()).get("model", {}))
    return ModelConfig(**model)


def hf_twin(ours: MiniMindForCausalLM):
    """transformers' LlamaForCausalLM with our dims, holding our weights (tied embedding, no biases, sdpa)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = ours.config
    hf_cfg = LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta, tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
        hidden_act="silu", use_cache=False, attn_implementation="sdpa",
    )
    hf = LlamaForCausalLM(hf_cfg)
    hf.load_state_dict(ours.state_dict(), strict=True)
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr(), "HF lost the weight tie"
    assert hf.config._attn_implementation == "sdpa"
    return hf


def loss_of(model, x, y, is_hf: bool):
    """The same loss for both: ours computes it inside forward; HF's logits get the identical expression.

    HF is fed the input only (no labels=): its own loss would shift the labels a second time.
    """
    if not is_hf:
        return model(x, y)[1]
    logits = model(input_ids=x).logits
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))


def precision_ctx(precision: str):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


def train_step_fn(model, optimizer, x, y, precision: str, is_hf: bool):
    """One step exactly as mmkit.train.train does it (lr set, autocast, clip, AdamW, zero_grad, .item())."""
    step = [0]

    def run():
        step[0] += 1
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step[0], 1000, LR)
        with precision_ctx(precision):
            loss = loss_of(model, x, y, is_hf)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return run


def matmul_params(c: ModelConfig) -> int:
    """N of the FLOP formula: non-embedding parameters + the lm_head matmul (tied, so = all parameters)."""
    attn = 2 * c.hidden_size * c.num_attention_heads * c.head_dim + 2 * c.hidden_size * c.num_key_value_heads * c.head_dim
    mlp = 3 * c.hidden_size * c.intermediate_size
    norms = 2 * c.hidden_size
    return c.num_hidden_layers * (attn + mlp + norms) + c.hidden_size + c.vocab_size * c.hidden_size


def step_flops(c: ModelConfig, batch: int = BATCH, seq: int = SEQ) -> float:
    """6 * N * tokens + 12 * L * seq * (heads * head_dim) * tokens (see the table footnote)."""
    tokens = batch * seq
    return 6 * matmul_params(c) * tokens + 12 * c.num_hidden_layers * seq * c.num_attention_heads * c.head_dim * tokens


def initial_loss_gap(ours, hf, x, y, precision: str) -> float:
    """|loss_ours - loss_HF| on the same batch before any step: shows the two hold the same weights."""
    with torch.no_grad(), precision_ctx(precision):
        return abs(loss_of(ours, x, y, False).item() - loss_of(hf, x, y, True).item())


def bench_train_steps(dims_list, threads_list, reps: int, warmup: int) -> list:
    rows = []
    for dims in dims_list:
        c = model_config(dims)
        torch.manual_seed(0)
        ours = MiniMindForCausalLM(c)
        hf = hf_twin(ours)
        assert sum(p.numel() for p in hf.parameters()) == ours.num_parameters() == matmul_params(c)
        gen = torch.Generator().manual_seed(0)
        x = torch.randint(0, c.vocab_size, (BATCH, SEQ), generator=gen)
        y = torch.randint(0, c.vocab_size, (BATCH, SEQ), generator=gen)
        gaps = {p: initial_loss_gap(ours, hf, x, y, p) for p in ("fp32", "bf16")}
        opts = {name: torch.optim.AdamW(m.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
                for name, m in (("ours", ours), ("hf", hf))}
        ours.train()
        hf.train()
        flops = step_flops(c)
        print(f"[step] {dims}: {ours.num_parameters() / 1e6:.2f}M params, {flops / 1e9:.1f} GFLOP/step, "
              f"initial |loss gap| fp32 {gaps['fp32']:.2e} bf16 {gaps['bf16']:.2e}", flush=True)
        for threads in threads_list:
            torch.set_num_threads(threads)
            candidates = {}
            for precision in ("fp32", "bf16"):
                for impl, model in (("ours", ours), ("hf", hf)):
                    candidates[f"{impl}-{precision}"] = train_step_fn(model, opts[impl], x, y, precision, impl == "hf")
            times = time_interleaved(candidates, reps, warmup,
                                     label=f"{dims} {threads}t" if reps > 1 else "")
            hf_fp32 = times["hf-fp32"]
            for name, t in times.items():
                impl, precision = name.split("-")
                hf_same = times[f"hf-{precision}"]
                row = {"section": "step", "what": impl, "dims": dims, "precision": precision, "threads": threads,
                       **summary(t), "gflop": flops / 1e9,
                       "gflops": flops / 1e9 / statistics.median(t),
                       "vs_hf_same_precision": statistics.median(t) / statistics.median(hf_same),
                       "vs_hf_same_precision_paired": paired_ratio(t, hf_same),
                       "vs_hf_fp32": statistics.median(t) / statistics.median(hf_fp32),
                       "vs_hf_fp32_paired": paired_ratio(t, hf_fp32),
                       "initial_loss_gap": gaps[precision]}
                rows.append(row)
                print(f"[step] {dims:>15} {threads}t {precision} {impl:>4}: {row['median_ms']:8.1f} ms "
                      f"(iqr {row['iqr_pct']:.0f}%)  /HF same prec {row['vs_hf_same_precision']:.3f}  "
                      f"/HF fp32 {row['vs_hf_fp32']:.3f}  {row['gflops']:.1f} GFLOP/s", flush=True)
    return rows


# --- b. the machine's matmul rate -----------------------------------------------------------------


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
    peak = {(r["precision"], r["threads"]): r["gflops"] for r in matmul_rows}
    for r in step_rows:
        if (r["precision"], r["threads"]) in peak:
            r["matmul_share"] = r["gflops"] / peak[(r["precision"], r["threads"])]


# --- c. checkpoint I/O ------------------------------------------------------------------------------


def resume_sized_state(dims: str) -> dict:
    """What run.py --stop-at writes: model + AdamW state (exp_avg, exp_avg_sq populated) + step + data position."""
    torch.manual_seed(0)
    model = MiniMindForCausalLM(model_config(dims))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3  # one AdamW step fills its state; the grad values do not matter
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    gen = torch.Generator().manual_seed(0)
    return resume_state(model.state_dict(), optimizer.state_dict(), 1, 0, gen, {"format": 1, "note": "bench"}, {}, [],
                        data_position={"epoch": 0, "batch": 1}, rng_state=global_rng_state(), scaler=None)


def dd_write(path: Path, mib: int) -> float:
    """Seconds dd reports for writing MIB MiB of zeros with conv=fsync (its own clock, not process start)."""
    out = subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", "conv=fsync"],
                         capture_output=True, text=True, check=True, env={**os.environ, "LC_ALL": "C"})
    m = re.search(r"copied, ([0-9.eE+-]+) s", out.stderr)
    if not m:
        raise RuntimeError(f"cannot parse dd's output: {out.stderr!r}")
    return float(m.group(1))


def fresh(path: Path):
    """Before each timed write: no old target, and no dirty pages of an earlier write left to flush."""
    path.unlink(missing_ok=True)
    Path(str(path) + ".tmp").unlink(missing_ok=True)
    os.sync()


def bench_saves(obj: dict, io_dir: Path, reps: int, warmup: int) -> tuple:
    atomic, plain, raw = io_dir / "atomic.pth", io_dir / "plain.pth", io_dir / "dd.bin"
    torch.save(obj, plain)
    size = plain.stat().st_size
    mib = max(1, round(size / 2**20))
    dd_seconds = []

    def run_atomic():
        fresh(atomic)
        return time_once(lambda: save_atomic(obj, atomic))

    def run_plain():
        fresh(plain)
        return time_once(lambda: torch.save(obj, plain))

    def run_dd():
        fresh(raw)
        dd_seconds.append(dd_write(raw, mib))

    # each candidate times itself after an untimed fresh(); time_interleaved's clock would include the sync
    own = {"save_atomic": [], "torch_save": []}
    runs = {"save_atomic": lambda: own["save_atomic"].append(run_atomic()),
            "torch_save": lambda: own["torch_save"].append(run_plain()),
            "dd_fsync": run_dd}
    time_interleaved(runs, reps, warmup)
    measured = {"save_atomic": own["save_atomic"][-reps:], "torch_save": own["torch_save"][-reps:],
                "dd_fsync": dd_seconds[-reps:]}
    mbs = {"save_atomic": size / 1e6, "torch_save": size / 1e6, "dd_fsync": mib * 2**20 / 1e6}
    dd_s_per_mb = statistics.median(measured["dd_fsync"]) / mbs["dd_fsync"]
    rows = []
    for what, t in measured.items():
        mb = mbs[what]
        row = {"section": "save", "what": what, "mb": mb, **summary(t), "mb_per_s": mb / statistics.median(t),
               "vs_torch_save": statistics.median(t) / statistics.median(measured["torch_save"]),
               "vs_torch_save_paired": paired_ratio(t, measured["torch_save"]),
               "vs_dd_fsync": statistics.median(t) / mb / dd_s_per_mb}  # per byte: dd writes whole MiB
        rows.append(row)
        print(f"[save] {what:>11}: {mb:.0f} MB in {row['median_ms']:.0f} ms ({row['mb_per_s']:.0f} MB/s), "
              f"/torch.save {row['vs_torch_save']:.2f}, /dd {row['vs_dd_fsync']:.2f}", flush=True)
    for p in (plain, raw):
        p.unlink(missing_ok=True)
    return rows, atomic


def read_all(obj) -> float:
    """Touch every byte of every tensor (what the first training step would do with the loaded state)."""
    if isinstance(obj, torch.Tensor):
        return float(obj.sum()) if obj.numel() else 0.0
    if isinstance(obj, dict):
        return sum(read_all(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(read_all(v) for v in obj)
    return 0.0


def bench_loads(path: Path, reps: int, warmup: int) -> list:
    mb = path.stat().st_size / 1e6

    def load(mmap: bool):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)

    runs = {"load": lambda: load(False), "load_mmap": lambda: load(True),
            "load+read": lambda: read_all(load(False)), "load_mmap+read": lambda: read_all(load(True))}
    times = time_interleaved(runs, reps, warmup)
    rows = []
    for what, t in times.items():
        base = "load+read" if what.endswith("+read") else "load"
        row = {"section": "load", "what": what, "mb": mb, **summary(t), "mb_per_s": mb / statistics.median(t),
               "vs_no_mmap": statistics.median(t) / statistics.median(times[base])}
        rows.append(row)
        print(f"[load] {what:>14}: {mb:.0f} MB in {row['median_ms']:.1f} ms, /no-mmap {row['vs_no_mmap']:.3f}",
              flush=True)
    return rows


def bench_checkpoint_io(dims: str, io_dir: Path, reps: int, warmup: int) -> list:
    torch.set_num_threads(1)  # as the workflow's training jobs (threads: 1); also spares I/O from a busy 2nd core
    obj = resume_sized_state(dims)
    print(f"[io] resume dict of the {dims} model, written in {io_dir}", flush=True)
    save_rows, atomic = bench_saves(obj, io_dir, reps, warmup)
    del obj
    load_rows = bench_loads(atomic, reps, warmup)
    atomic.unlink(missing_ok=True)
    for r in save_rows + load_rows:
        r["dims"] = dims
    return save_rows + load_rows


# --- d. DAG overhead ---------------------------------------------------------------------------


def dag_overhead(args) -> list:
    """The default DAG from a fresh copy, timed whole, vs the training steps inside it.

    At --cores 1 the jobs run one after another, so wall - training = process starts, imports, data
    preparation, analysis jobs and snakemake itself. --cores 2 shows what running jobs side by side buys.
    """
    rows = []
    for cores in args.dag_cores:
        work = Path(tempfile.mkdtemp(prefix=".bench-dag-", dir=ROOT / "bench"))
        try:
            for name in ("Snakefile", "config.yaml", "environment.yml"):
                shutil.copy2(ROOT / name, work / name)
            shutil.copytree(ROOT / "workflow", work / "workflow", ignore=shutil.ignore_patterns("__pycache__"))
            env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "snakemake", "--cores", str(cores), "--quiet", "all"],
                           cwd=work, env=env, check=True, capture_output=True)
            wall = time.perf_counter() - t0
            timing = [yaml.safe_load(f.read_text()) for f in (work / "results" / "timing").glob("*.json")]
        finally:
            shutil.rmtree(work, ignore_errors=True)
        train = sum(t["train_seconds"] for t in timing)
        steps = sum(t["last_step"] - t["first_step"] + 1 for t in timing)
        row = {"section": "dag", "what": f"snakemake --cores {cores}", "cores": cores, "reps": 1,
               "median_ms": wall * 1000, "min_ms": wall * 1000, "iqr_pct": 0.0, "train_ms": train * 1000,
               "train_steps": steps, "jobs_training": len(timing), "overhead_ms": (wall - train) * 1000,
               "overhead_share": (wall - train) / train}
        rows.append(row)
        print(f"[dag] --cores {cores}: {wall:.1f} s wall, {train:.1f} s in {steps} training steps "
              f"({len(timing)} jobs): overhead {row['overhead_share'] * 100:.0f}% of training", flush=True)
    return rows


# --- report ---------------------------------------------------------------------------------------


def fmt(v, spec: str = ".1f") -> str:
    return "" if v is None or v == "" else format(v, spec)


def ms_cell(r: dict, spec: str = ".1f") -> str:
    flag = " ⚠" if r["iqr_pct"] > NOISY_IQR_PCT else ""
    return f"{format(r['median_ms'], spec)} (±{r['iqr_pct']:.0f}%){flag}"


def pct(share) -> str:
    return "" if share is None else f"{100 * share:.0f}"


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

    return (f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__} "
            f"(CPU capability {torch.backends.cpu.get_cpu_capability()}), transformers {transformers.__version__}, "
            f"Python {platform.python_version()}")


def render_markdown(rows: list, header: list) -> str:
    out = ["# Benchmark results", "", *header, ""]

    step = [r for r in rows if r["section"] == "step"]
    if step:
        out += ["## a. Training step: ours vs transformers LlamaForCausalLM (same weights)", "",
                "| dims | threads | precision | ours ms | HF ms | ours/HF | ours/HF paired | ours/HF-fp32 "
                "| HF/HF-fp32 | GFLOP/step | ours GFLOP/s | ours % matmul | HF % matmul | initial loss gap |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        by = {(r["dims"], r["threads"], r["precision"], r["what"]): r for r in step}
        for (dims, threads, precision, impl), o in by.items():
            if impl != "ours":
                continue
            h = by[(dims, threads, precision, "hf")]
            out.append(
                f"| {dims} | {threads} | {precision} | {ms_cell(o)} | {ms_cell(h)} "
                f"| **{o['vs_hf_same_precision']:.3f}** | {o['vs_hf_same_precision_paired']:.3f} "
                f"| {o['vs_hf_fp32']:.3f} | {h['vs_hf_fp32']:.3f} | {o['gflop']:.1f} | {o['gflops']:.1f} "
                f"| {pct(o.get('matmul_share'))} | {pct(h.get('matmul_share'))} | {o['initial_loss_gap']:.1e} |")
        out += ["",
                "Times are medians of the repetitions; (±x%) is the interquartile range over the median; "
                f"⚠ marks a spread over {NOISY_IQR_PCT}%: the machine was busy with other work then, and "
                "that row's figures, ratios included, are not to be trusted. "
                "All four candidates of a (dims, threads) block ran round-robin, order reversed every round. "
                "Ratios are time ratios (< 1 = faster than the reference), taken from medians of this same run; "
                "`paired` is the median of the per-round ratios (each pair timed back to back), the more robust "
                "of the two when the machine's speed drifts; the CSV has it for every ratio (`*_paired`). "
                "A step = set lr, forward (under `torch.autocast('cpu', bfloat16)` for bf16, fp32 master weights), "
                "cross-entropy on fp32 logits vs the shifted targets (HF gets input_ids only; the loss is computed "
                "outside it with the same expression as ours), backward, clip_grad_norm_(1.0), AdamW(wd 0.01), "
                "zero_grad(set_to_none), loss.item(); batch 8 x seq 128 of random tokens. "
                "Initial loss gap = |loss_ours - loss_HF| on the same batch before training, in that precision.",
                "",
                "FLOPs per step = 6 · N · tokens + 12 · L · seq · (heads · head_dim) · tokens, "
                "N = non-embedding parameters + the lm_head matmul (vocab · hidden; tied to the embedding, "
                "whose lookup costs no FLOPs), tokens = 8 · 128. The attention term counts the full seq² "
                "score matrix (QKᵀ and AV, forward + backward) as in the PaLM appendix, though causal attention "
                "needs about half. Norms, activations, softmax, RoPE and AdamW are not counted. "
                "% matmul = the step's GFLOP/s over the matmul rate of section b at the same precision and "
                "thread count.", ""]

    mm = [r for r in rows if r["section"] == "matmul"]
    if mm:
        out += ["## b. Matmul rate", "", "| matmul | precision | threads | ms | GFLOP/s |", "|---|---|---|---|---|"]
        out += [f"| {r['what']} | {r['precision']} | {r['threads']} | {ms_cell(r, '.2f')} "
                f"| {r['gflops']:.1f} |" for r in mm]
        out += ["", "GFLOP/s = 2·n³ / median time; bf16 operands are bfloat16 tensors (what autocast feeds "
                "the matmuls), fp32 accumulation as the library does it.", ""]

    io = [r for r in rows if r["section"] in ("save", "load")]
    if io:
        out += ["## c. Checkpoint I/O (resume file: model + AdamW state)", "",
                "| operation | dims | MB | ms | MB/s | ÷ torch.save | ÷ dd fsync | ÷ same without mmap |",
                "|---|---|---|---|---|---|---|---|"]
        for r in io:
            out.append(f"| {r['what']} | {r['dims']} | {r['mb']:.0f} | {ms_cell(r)} "
                       f"| {r['mb_per_s']:.0f} | {fmt(r.get('vs_torch_save'), '.2f')} "
                       f"| {fmt(r.get('vs_dd_fsync'), '.2f')} | {fmt(r.get('vs_no_mmap'), '.3f')} |")
        out += ["",
                "save_atomic = mmkit.checkpoint.save_atomic (write PATH.tmp, asking the kernel to start writeback every "
                "8 MB as it goes, flush, fsync, os.replace, fsync the "
                "directory): durable. torch_save = torch.save(obj, path): returns once the bytes are in the page "
                "cache, NOT durable. dd_fsync = `dd if=/dev/zero bs=1M count=<file size in MiB, rounded> conv=fsync`, "
                "the time dd reports: the disk's raw durable write rate; ÷ dd fsync compares time per byte. "
                "All three ran round-robin. Before every timed write the old file is removed and "
                "`os.sync()` flushes earlier writes (untimed), so no write pays for another's dirty pages. "
                "Loads are `torch.load(map_location='cpu', weights_only=True[, mmap=True])` of the file just "
                "written, so from a warm page cache, at 1 torch thread; with mmap the bytes are read lazily, so `+read` also sums "
                "every tensor once (the cost a training step would then pay).", ""]

    dag = [r for r in rows if r["section"] == "dag"]
    if dag:
        out += ["## d. The whole DAG vs its training steps (default config)", "",
                "| run | wall s | training s (steps) | wall − training s | overhead ÷ training |",
                "|---|---|---|---|---|"]
        out += [f"| {r['what']} | {r['median_ms'] / 1000:.1f} | {r['train_ms'] / 1000:.1f} ({r['train_steps']}) "
                f"| {r['overhead_ms'] / 1000:.1f} | {100 * r['overhead_share']:.0f}% |" for r in dag]
        out += ["", "One snakemake run from a fresh copy of the workflow (tokenizer, every training job, every "
                "analysis job, report). Training s = the sum of the training loops' own clocks (timing/*.json). "
                "At --cores 1 the jobs run one at a time, so wall − training is the overhead: process starts and "
                "imports (torch alone ≈ 1.7 s a process), tokenizer training, analysis jobs and snakemake. At "
                "--cores 2 two jobs run side by side, so wall can fall below the summed training time.", ""]
    return "\n".join(out) + "\n"


def targets_table(rows: list) -> str:
    """The project's speed targets, each with the ratio this run measured and whether it was met."""
    def step(dims, precision, threads):
        return next((r for r in rows if r["section"] == "step" and r["what"] == "ours" and r["dims"] == dims
                     and r["precision"] == precision and r["threads"] == threads), None)

    lines = ["| target | measured (this run) | met |", "|---|---|---|"]

    def add(target, value, limit, how):
        if value is not None:
            lines.append(f"| {target} | {value:.3f} ({how}) | {'yes' if value <= limit else 'no'} |")

    for dims in DIMS_SOURCES:
        for threads in (1, 2):
            r = step(dims, "fp32", threads)
            if r:
                add(f"fp32 step ÷ transformers fp32 step ≤ 1.0, {dims}, {threads} thread(s)",
                    r["vs_hf_same_precision_paired"], 1.0, "paired median")
    r = step("minimind2-small", "bf16", 1)
    if r:
        add("bf16 step ÷ transformers fp32 step ≤ 0.33, minimind2-small, 1 thread", r["vs_hf_fp32_paired"], 0.33,
            "paired median")
    save = next((r for r in rows if r["section"] == "save" and r["what"] == "save_atomic"), None)
    if save:
        add("durable atomic save ÷ plain torch.save ≤ 1.15", save["vs_torch_save"], 1.15, "ratio of medians")
    dag = next((r for r in rows if r["section"] == "dag" and r["cores"] == 1), None)
    if dag:
        add("DAG overhead ÷ training compute ≤ 0.15, default config", dag["overhead_share"], 0.15,
            "--cores 1: (wall − training) ÷ training")
    return "\n".join(lines) + "\n"


def write_csv(rows: list, path: Path) -> None:
    fields = []
    for r in rows:
        fields += [k for k in r if k not in fields]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


# --- main -----------------------------------------------------------------------------------------


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-csv", type=Path, required=True)
    p.add_argument("--out-md", type=Path, required=True)
    p.add_argument("--out-targets", type=Path, help="markdown table of the speed targets (the README's)")
    p.add_argument("--from-csv", type=Path, help="measure nothing: write the targets table (--out-targets) of an earlier run's CSV")
    p.add_argument("--quick", action="store_true",
                   help="few repetitions; step timings and the resume file at the default dims only")
    p.add_argument("--dims", help=f"comma list of {', '.join(DIMS_SOURCES)} (default: both; --quick: default)")
    p.add_argument("--threads", default="1,2", help="comma list of torch thread counts (default 1,2)")
    p.add_argument("--reps", type=int, help="timed repetitions per candidate (default 10; --quick 3)")
    p.add_argument("--warmup", type=int, help="untimed calls per candidate first (default 2; --quick 1)")
    p.add_argument("--io-dims", choices=list(DIMS_SOURCES),
                   help="model whose resume dict is saved/loaded (default minimind2-small; --quick default)")
    p.add_argument("--io-dir", type=Path, default=ROOT / "bench",
                   help="directory on the disk to measure; a temporary folder is made inside it (default bench/)")
    p.add_argument("--matmul-n", type=int, help="matmul size n (default 2048; --quick 1024)")
    p.add_argument("--skip", default="", help="comma list of sections to skip: step,matmul,io,dag")
    p.add_argument("--dag-cores", default="1,2", help="comma list of snakemake --cores for the DAG timing")
    args = p.parse_args()
    q = args.quick
    args.dims = (args.dims or ("default" if q else ",".join(DIMS_SOURCES))).split(",")
    bad = [d for d in args.dims if d not in DIMS_SOURCES]
    if bad:
        p.error(f"--dims: unknown {bad}; choose from {list(DIMS_SOURCES)}")
    args.threads = [int(t) for t in args.threads.split(",")]
    args.reps = args.reps or (3 if q else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if q else 2)
    args.io_dims = args.io_dims or ("default" if q else "minimind2-small")
    args.matmul_n = args.matmul_n or (1024 if q else 2048)
    args.skip = set(filter(None, args.skip.split(",")))
    args.dag_cores = [int(c) for c in args.dag_cores.split(",")]
    return args


def read_csv_rows(path: Path) -> list:
    """Rows of an earlier run's CSV, numbers as numbers, empty cells dropped."""
    def value(v):
        for kind in (int, float):
            try:
                return kind(v)
            except ValueError:
                pass
        return v

    with open(path, newline="") as f:
        return [{k: value(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)]


def main():
    args = parse_args()
    if args.from_csv:
        (args.out_targets or args.out_md).write_text(targets_table(read_csv_rows(args.from_csv)))
        return
    torch.use_deterministic_algorithms(True)  # as mmkit.train.make_deterministic sets it for every training run
    start, load_before = time.perf_counter(), os.getloadavg()
    print(f"bench: {machine_info()}", flush=True)
    rows = []
    if "matmul" not in args.skip:
        rows += bench_matmul(args.matmul_n, args.threads, max(args.reps, 5), args.warmup)
    if "step" not in args.skip:
        step_rows = bench_train_steps(args.dims, args.threads, args.reps, args.warmup)
        add_matmul_share(step_rows, [r for r in rows if r["section"] == "matmul"])
        rows += step_rows
    if "io" not in args.skip:
        io_dir = Path(tempfile.mkdtemp(prefix=".bench-io-", dir=args.io_dir))
        try:
            rows += bench_checkpoint_io(args.io_dims, io_dir, args.reps, args.warmup)
        finally:
            shutil.rmtree(io_dir, ignore_errors=True)
    if "dag" not in args.skip:
        rows += dag_overhead(args)
    torch.set_num_threads(os.cpu_count() or 1)

    elapsed = time.perf_counter() - start
    header = [f"- machine: {machine_info()}",
              f"- mode: {'--quick' if args.quick else 'full'}; {args.reps} timed repetitions per candidate after "
              f"{args.warmup} warm-up; dims {', '.join(args.dims)}; threads {args.threads}; "
              f"resume file of the {args.io_dims} model",
              f"- load average (1/5/15 min) at start {'/'.join(f'{x:.2f}' for x in load_before)}, at end "
              f"{'/'.join(f'{x:.2f}' for x in os.getloadavg())}; the run took {elapsed:.0f} s",
              f"- command: `python bench/bench.py {' '.join(sys.argv[1:])}`"]
    write_csv(rows, args.out_csv)
    args.out_md.parent.mkdir(parents=True, exist_ok=True)
    args.out_md.write_text(render_markdown(rows, header))
    if args.out_targets:
        args.out_targets.write_text(targets_table(rows))
    print(f"bench: wrote {args.out_csv} and {args.out_md} after {elapsed:.0f} s", flush=True)


if __name__ == "__main__":
    main()
