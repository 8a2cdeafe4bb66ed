"""The benchmark's outputs: results.csv (every row), results.md (every section) and targets.md (the README's)."""

import csv
from pathlib import Path

from common import NOISY_IQR_PCT, TARGET_DIMS


def fmt(v, spec: str = ".1f") -> str:
    return "" if v is None or v == "" else format(v, spec)


def ms_cell(r: dict, spec: str = ".1f") -> str:
    flag = " ⚠" if r["iqr_pct"] > NOISY_IQR_PCT else ""
    return f"{format(r['median_ms'], spec)} (±{r['iqr_pct']:.0f}%){flag}"


def pct(share) -> str:
    return "" if share is None else f"{100 * share:.0f}"


def machine(rows: list) -> str:
    return next((r["what"] for r in rows if r["section"] == "machine"), "unknown machine")


def section(title: str, columns: list, cells: list, footnote: str) -> list:
    """A results.md section's lines: heading, table (one list of cells per row), footnote; none without rows."""
    if not cells:
        return []
    return [f"## {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
            *("| " + " | ".join(row) + " |" for row in cells), "", footnote, ""]


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
                "outside it with the same expression as ours), backward, clip_grad_norm_(1.0), AdamW(wd 0.01; ours with config.yaml's `adamw` kernel, HF with torch's default, as a user of transformers writes it), "
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

    out += section("b. Matmul rate", ["matmul", "precision", "threads", "ms", "GFLOP/s"],
                   [[r["what"], r["precision"], str(r["threads"]), ms_cell(r, ".2f"), f"{r['gflops']:.1f}"]
                    for r in rows if r["section"] == "matmul"],
                   "GFLOP/s = 2·n³ / median time; bf16 operands are bfloat16 tensors (what autocast feeds "
                   "the matmuls), fp32 accumulation as the library does it.")
    out += section("c. Checkpoint I/O (resume file: model + AdamW state)",
                   ["operation", "dims", "MB", "ms", "MB/s", "÷ torch.save", "÷ dd fsync", "÷ same without mmap"],
                   [[r["what"], r["dims"], f"{r['mb']:.0f}", ms_cell(r), f"{r['mb_per_s']:.0f}",
                     fmt(r.get("vs_torch_save"), ".2f"), fmt(r.get("vs_dd_fsync"), ".2f"),
                     fmt(r.get("vs_no_mmap"), ".3f")] for r in rows if r["section"] in ("save", "load")],
                   "save_atomic = mmkit.checkpoint.files.save_atomic (write PATH.tmp, asking the kernel to start writeback "
                   "every 8 MB as it goes, flush, fsync, os.replace, fsync the "
                   "directory): durable. torch_save = torch.save(obj, path): returns once the bytes are in the page "
                   "cache, NOT durable. dd_fsync = `dd if=/dev/zero bs=1M count=<file size in MiB, rounded> "
                   "conv=fsync`, the time dd reports: the disk's raw durable write rate; ÷ dd fsync compares time "
                   "per byte. All three ran round-robin. Before every timed write the old file is removed and "
                   "`os.sync()` flushes earlier writes (untimed), so no write pays for another's dirty pages. "
                   "Loads are `torch.load(map_location='cpu', weights_only=True[, mmap=True])` of the file just "
                   "written, so from a warm page cache, at 1 torch thread; with mmap the bytes are read lazily, so "
                   "`+read` also sums every tensor once (the cost a training step would then pay).")

    dag = [r for r in rows if r["section"] == "dag"]
    if dag:
        out += ["## d. The whole DAG vs its training steps", "",
                "| config | run | wall s | training s (steps) | wall − training s | overhead ÷ training |",
                "|---|---|---|---|---|---|"]
        out += [f"| {r['dims']} | {r['what']} | {r['median_ms'] / 1000:.1f} | {r['train_ms'] / 1000:.1f} "
                f"({r['train_steps']}) | {r['overhead_ms'] / 1000:.1f} | {100 * r['overhead_share']:.1f}% |" for r in dag]
        for r in (r for r in dag if r["cores"] == 1 and r.get("other_jobs_s")):
            jobs = (item.split("=") for item in r["other_jobs_s"].split())
            out += ["", f"The jobs other than training, {r['dims']} at --cores 1 (from snakemake's log, 1 s "
                    "resolution, process start included): " + ", ".join(f"{rule} {s} s" for rule, s in jobs) + "."]
        out += ["", "One snakemake run of `all` from a fresh copy of the workflow (tokenizer, every training job, every "
                "analysis job, report), with config.yaml and, for minimind2-small, presets/minimind2-small.yaml. "
                "Training s = the sum of the training loops' own clocks (timing/*.json). "
                "At --cores 1 the jobs run one at a time, so wall − training is the overhead: process starts and "
                "imports (torch alone ≈ 1.7 s a process), tokenizer training, analysis jobs and snakemake. At "
                "--cores 2 two jobs run side by side, so wall can fall below the summed training time.", ""]

    out += section("e. Peak resident memory of a training job",
                   ["config", "precision", "allocator", "peak RSS MB", "ms per step"],
                   [[r["dims"], r["precision"], r["what"], f"{r['peak_rss_mib'] * 2**20 / 1e6:.0f}",
                     f"{r['ms_per_step']:.0f}"] for r in rows if r["section"] == "memory"],
                   "run.py as the workflow runs it (config.yaml + the preset, 4 steps, threads 1), in its own "
                   "process; peak RSS = its VmHWM at exit (MB = 10⁶ bytes). The second allocator row pins "
                   "glibc's mmap threshold (MALLOC_MMAP_THRESHOLD_=131072): freed tensors go back to the kernel at "
                   "once, so the peak is what is live, and every step pays page faults for its activations again.")
    out += section("f. Where a step's time goes (torch.profiler, self CPU time of each operator, grouped)",
                   ["precision", "part", "ms per step", "share"],
                   [[r["precision"], r["what"], f"{r['ms_per_step']:.0f}", f"{100 * r['share']:.0f}%"]
                    for r in rows if r["section"] == "profile"],
                   f"Our step at {TARGET_DIMS} dims, 1 thread, batch 8 × 128, after one warm-up step; operators "
                   "grouped by name (bench/op_profile.py: PARTS). matmul = aten::mm/addmm/bmm; AdamW = the fused "
                   "kernel or the for-loop's per-parameter ops; dtype casts = autocast's copies.")
    out += section("g. The step's options against the configured step",
                   ["precision", "option", "ms", "÷ configured (paired)", "compile s"],
                   [[r["precision"], r["what"], ms_cell(r, ".0f"), f"**{r['vs_configured_paired']:.3f}**",
                     fmt(r.get("compile_s"))] for r in rows if r["section"] == "options"],
                   f"Our step at {TARGET_DIMS} dims, 1 thread, with config.yaml's settings (configured) and with "
                   "one setting changed, all holding the same weights, run round-robin; < 1 = the option is faster. "
                   "torch.compile compiles the model (default mode) on its first call, timed apart; a second run "
                   "on the same machine finds inductor's cache warm and compiles much faster.")
    out += section("i. certify's recorder: a step with its hooks against the same step without",
                   ["what", "ms", "÷ plain (paired)", "MB digested a step", "GB/s"],
                   [[r["what"], ms_cell(r, ".1f") if "iqr_pct" in r else fmt(r["median_ms"]), fmt(r.get("vs_plain_paired"), ".3f"), fmt(r.get("mb_per_step"), ".0f"),
                     fmt(r.get("gb_per_s"), ".2f")] for r in rows if r["section"] == "certify"],
                   "The default config's model (config.yaml), 1 thread, batch 8 × 128, fused AdamW, the two steps "
                   "run round-robin; recorded = certkit.recorder's hooks registered for the step (the model's "
                   "inputs, the RNGs, the gradients, the LR, AdamW's state and the parameters, a JSON line "
                   "written). The digest rows: the parameters, gradients and AdamW's moments, once each, by "
                   "certkit.digest's multilinear hash and by sha1 (best of the repetitions).")
    out += section("j. certify's wall time ÷ the straight run alone",
                   ["verdict", "lanes", "steps", "certify s", "alone s", "÷ alone"],
                   [[r["what"], r["jobs"], str(r["steps"]), fmt(r["certify_s"], ".1f"), fmt(r["alone_s"], ".1f"),
                     f"**{r['vs_alone']:.3f}**"] for r in rows if r["section"] == "lanes"],
                   "bench/lanes_loop.py (the default config's model, 1 thread, batch 8 × 128), its steps chosen so that "
                   "it runs at least 20 s alone; certify with K = half the steps, the resume kept (exact) or its batch "
                   "generator forgotten (not exact: "
                   "the runs end at the first difference). Alone: the same command without certify, run before and "
                   "after each certify, the mean of the two.")
    return "\n".join(out) + "\n"


def targets_table(rows: list) -> str:
    """The speed targets (issue 14), each with the figure this run measured, where it comes from, and whether it
    was met; the machine's ISA flags first, since every figure depends on them."""
    def one(section, **match):
        return next((r for r in rows if r["section"] == section and all(r.get(k) == v for k, v in match.items())),
                    None)

    info = machine(rows)
    amx = "amx_bf16 yes" in info
    lines = [f"Machine: {info}.", "",
             "| target | limit | measured (this run) | met | from |", "|---|---|---|---|---|"]

    def add(target, value, limit, source, shown=None, applies=True, below=True):
        if value is None:
            return
        met = (value <= limit if below else value >= limit) if applies else "n/a: no AMX on this CPU"
        met = {True: "yes", False: "no"}.get(met, met)
        lines.append(f"| {target} | {'≤' if below else '≥'} {shown or limit} | {fmt(value, '.3f')} | {met} | {source} |")

    step = {p: one("step", what="ours", dims=TARGET_DIMS, precision=p, threads=1) for p in ("fp32", "bf16")}
    if step["fp32"]:
        add(f"fp32 step ÷ transformers fp32 step, {TARGET_DIMS}, 1 thread", step["fp32"]["vs_hf_same_precision_paired"],
            0.80, "a: paired median")
    if step["bf16"]:
        add(f"bf16 step ÷ transformers fp32 step, {TARGET_DIMS}, 1 thread, on a CPU with AMX",
            step["bf16"]["vs_hf_fp32_paired"], 0.30, "a: paired median", applies=amx)
    for p, r in step.items():
        if r and "matmul_share" in r:
            add(f"{p} step's matmul share (FLOPs ÷ matmul rate ÷ step time), {TARGET_DIMS}, 1 thread",
                r["matmul_share"], 0.60, "a ÷ b", shown="60%", below=False)
    dag = one("dag", dims=TARGET_DIMS, cores=1)
    if dag:
        add(f"DAG overhead ÷ training time, {TARGET_DIMS} preset, --cores 1", dag["overhead_share"], 0.10,
            "d: (wall − training) ÷ training", shown="10%")
    dag = one("dag", dims="default", cores=1)
    if dag:
        lines.append(f"| DAG overhead ÷ training time, default config, --cores 1 | (information) "
                     f"| {dag['overhead_share']:.3f} | | d: (wall − training) ÷ training |")
    mem = one("memory", dims=TARGET_DIMS, what="glibc default")
    if mem:
        add(f"peak RSS of a {TARGET_DIMS} training job, fp32 (GB)", mem["peak_rss_mib"] * 2**20 / 1e9, 1.1,
            "e: the job's VmHWM")
    save, dd = one("save", what="save_atomic"), one("save", what="dd_fsync")
    if save and dd:
        # torch.save returns with the bytes in the page cache. A durable save is at best the slower of that
        # and the disk's own durable write of as many bytes (dd conv=fsync): its floor, measured in this run
        dd_x = save["vs_torch_save"] / save["vs_dd_fsync"]  # dd's time for the file's bytes ÷ torch.save's
        floor_x = max(1.0, dd_x)  # ÷ torch.save can reach 1.25 only where 1.10 of the floor does
        lines.append(f"| durable atomic save ÷ plain torch.save, {save['dims']} resume file | ≤ 1.25 "
                     f"| {save['vs_torch_save']:.3f} | "
                     + ({True: "yes", False: "no"}[save["vs_torch_save"] <= 1.25] if floor_x <= 1.25 / 1.10 else
                        f"n/a: this disk's floor is {floor_x:.2f}× torch.save")
                     + f" | c: ratio of medians, {save['median_ms']:.0f} ÷ {save['median_ms'] / save['vs_torch_save']:.0f} ms |")
        add("durable atomic save ÷ its floor: the slower of torch.save and dd conv=fsync of the same bytes",
            save["vs_torch_save"] / floor_x, 1.10, f"c: ratio of medians; dd {dd_x:.2f}× torch.save in this run")
    stall = one("cost", what="stall per save")
    if stall:
        add(f"stall per save, checkpoint.async ÷ sync, {TARGET_DIMS} resume file", stall["async_vs_sync"], 0.15,
            f"h: medians, {stall['async_ms']:.0f} ÷ {stall['sync_ms']:.0f} ms")
    train, sync = one("cost", what="training time, checkpoints async"), one("cost", what="training time, checkpoints sync")
    if train:
        add(f"training time, a checkpoint every 10 steps ÷ none, async ({TARGET_DIMS}, 1 thread)", train["vs_none"],
            1.03, "h: ratio of medians" + (f"; sync beside it: {sync['vs_none']:.3f}" if sync else ""))
    auto = one("cost", what="training time, checkpoints auto")
    if auto:
        add("overhead measured with every: auto, overhead: 0.02 (async)", auto["overhead"], 0.025,
            f"h: ratio of medians − 1; auto chose every {auto['auto_every']} steps")
    recorded = one("certify", what="recorded")
    if recorded:
        fast, sha1 = one("certify", what="digest multilinear"), one("certify", what="digest sha1")
        add("a step under certify's recorder ÷ the same step without, default config, 1 thread",
            recorded["vs_plain_paired"], 1.10, f"i: paired median; digests {fast['gb_per_s']:.2f} GB/s "
            f"(sha1 {sha1['gb_per_s']:.2f}) of {fast['mb_per_step']:.0f} MB a step", shown="1.10")
    for verdict, limit in (("exact", 1.35), ("not exact", 0.70)):
        for jobs in ("default", "--jobs 1"):
            r = one("lanes", what=verdict, jobs=jobs)
            if r and jobs == "default":
                add(f"certify's wall time ÷ the straight run alone, {verdict} (K = half), default config, 1 thread",
                    r["vs_alone"], limit, f"j: {r['certify_s']:.1f} ÷ {r['alone_s']:.1f} s, default lanes")
            elif r:
                lines.append(f"| the same, {verdict}, --jobs 1 | (information) | {r['vs_alone']:.3f} | | "
                             f"j: {r['certify_s']:.1f} ÷ {r['alone_s']:.1f} s, one run after another |")
    recovery = one("cost", what="recovery")
    if recovery:
        lines.append(f"| recovery: restart to the end of its first step ÷ (one step + one process start) | (reported) "
                     f"| {recovery['vs_step_plus_start']:.3f} | | h: {recovery['total_s']:.2f} s; apart: start and "
                     f"imports {recovery['imports_s']:.2f}, build {recovery['build_s']:.2f}, read "
                     f"{recovery['read_s']:.2f}, checks {recovery['checks_s']:.2f}, step {recovery['first_step_s']:.2f} |")
    for mode in ("sync", "async"):
        pre = one("cost", what=f"preemption latency, {mode}")
        if pre:
            add(f"preemption latency, SIGTERM to a committed checkpoint, {mode} ÷ (one step + one save)", pre["vs_limit"],
                1.0, f"h: {pre['latency_s']:.2f} s of {pre['limit_s']:.2f} s")
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
