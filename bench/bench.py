"""Side-by-side CPU benchmark of this project's training step, matmul rate, checkpoint I/O, DAG and memory.

  python bench/bench.py --out-csv bench/results.csv --out-md bench/results.md --out-targets bench/targets.md [--quick]

One process measures, candidates interleaved so that drift on a shared machine hits all of them; every
figure is a median of repetitions and every ratio compares figures of this same run. One module a section:
  a. step.py       one training step, ours vs transformers' LlamaForCausalLM holding the same weights
  b. matmul.py     the fp32 and bf16 matmul rate, and each step's share of it
  c. ckpt_io.py    save_atomic vs torch.save vs dd conv=fsync; torch.load with and without mmap
  d. dag.py        the whole DAG's wall time vs the training loops inside it
  e. memory.py     peak resident memory of a MiniMind2-small training job
  f. op_profile.py where a step's time goes, per precision (torch.profiler)
  g. options.py    the step's options (AdamW kernels, attention written out, torch.compile) against the configured step
  h. ckpt_cost.py  what checkpoints cost the run: stall per save (sync, async), training time with them, every: auto,
                   recovery after a SIGKILL, preemption latency
tables.py writes the outputs; targets.md is the README's table of targets.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import DIMS_SOURCES, ROOT, TARGET_DIMS, machine_info

SECTIONS = ("matmul", "step", "options", "io", "cost", "dag", "memory", "profile", "certify")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-csv", type=Path, required=True)
    p.add_argument("--out-md", type=Path, required=True)
    p.add_argument("--out-targets", type=Path, help="markdown table of the speed targets (the README's)")
    p.add_argument("--from-csv", type=Path, help="measure nothing: write the targets table (--out-targets) of an earlier run's CSV")
    p.add_argument("--quick", action="store_true",
                   help="few repetitions; the default dims only; no MiniMind2-small DAG")
    p.add_argument("--dims", help=f"comma list of {', '.join(DIMS_SOURCES)} for the step (default: both; --quick: default)")
    p.add_argument("--threads", default="1,2", help="comma list of torch thread counts (default 1,2)")
    p.add_argument("--reps", type=int, help="timed repetitions per candidate (default 10; --quick 3)")
    p.add_argument("--warmup", type=int, help="untimed calls per candidate first (default 2; --quick 1)")
    p.add_argument("--io-dims", choices=list(DIMS_SOURCES),
                   help="model whose resume dict is saved/loaded (default minimind2-small; --quick default)")
    p.add_argument("--io-dir", type=Path, default=ROOT / "bench",
                   help="directory on the disk to measure; a temporary folder is made inside it (default bench/)")
    p.add_argument("--matmul-n", type=int, help="matmul size n (default 2048; --quick 1024)")
    p.add_argument("--skip", default="", help=f"comma list of sections to skip: {','.join(SECTIONS)}")
    p.add_argument("--keep-skipped", action="store_true",
                   help="keep the skipped sections' rows of an earlier run's --out-csv (one section measured again)")
    p.add_argument("--dag", default=None,
                   help="comma list of DIMS:CORES DAG runs (default default:1,default:2,minimind2-small:1; "
                        "--quick default:1)")
    args = p.parse_args()
    q = args.quick
    args.dims = (args.dims or ("default" if q else ",".join(DIMS_SOURCES))).split(",")
    bad = [d for d in args.dims if d not in DIMS_SOURCES]
    if bad:
        p.error(f"--dims: unknown {bad}; choose from {list(DIMS_SOURCES)}")
    args.threads = [int(t) for t in args.threads.split(",")]
    args.reps = args.reps or (3 if q else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if q else 2)
    args.io_dims = args.io_dims or ("default" if q else TARGET_DIMS)
    args.matmul_n = args.matmul_n or (1024 if q else 2048)
    args.skip = set(filter(None, args.skip.split(",")))
    args.dag = [(d, int(c)) for d, c in (x.split(":") for x in
                (args.dag or ("default:1" if q else f"default:1,default:2,{TARGET_DIMS}:1")).split(","))]
    return args


def measure(args) -> list:
    """Every section not skipped, in an order where each can use what the earlier ones measured."""
    from certify_lanes import bench_certify_lanes
    from certify_overhead import bench_certify_overhead
    from ckpt_cost import bench_checkpoint_cost
    from ckpt_io import bench_checkpoint_io
    from dag import dag_overhead
    from matmul import add_matmul_share, bench_matmul
    from memory import bench_memory
    from op_profile import bench_profile
    from options import bench_options
    from step import bench_train_steps

    rows = [{"section": "machine", "what": machine_info()}]
    if "matmul" not in args.skip:
        rows += bench_matmul(args.matmul_n, args.threads, max(args.reps, 5), args.warmup)
    if "step" not in args.skip:
        step_rows = bench_train_steps(args.dims, args.threads, args.reps, args.warmup)
        add_matmul_share(step_rows, [r for r in rows if r["section"] == "matmul"])
        rows += step_rows
    if "options" not in args.skip:
        rows += bench_options(args.reps, args.warmup)
    if "profile" not in args.skip:
        rows += bench_profile()
    if "memory" not in args.skip:
        rows += bench_memory(TARGET_DIMS)
    if "io" not in args.skip:
        io_dir = Path(tempfile.mkdtemp(prefix=".bench-io-", dir=args.io_dir))
        try:
            rows += bench_checkpoint_io(args.io_dims, io_dir, args.reps, args.warmup)
        finally:
            shutil.rmtree(io_dir, ignore_errors=True)
    if "cost" not in args.skip:
        work = Path(tempfile.mkdtemp(prefix=".bench-cost-", dir=args.io_dir))
        try:
            rows += bench_checkpoint_cost(TARGET_DIMS, work, args.reps, args.warmup, 1 if args.quick else 2)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if "dag" not in args.skip:
        rows += [dag_overhead(dims, cores) for dims, cores in args.dag]
    if "certify" not in args.skip:
        rows += bench_certify_overhead(args.reps, args.warmup)
    if "lanes" not in args.skip:
        rows += bench_certify_lanes()
    return rows


def main():
    args = parse_args()
    from tables import read_csv_rows, render_markdown, targets_table, write_csv

    if args.from_csv:
        (args.out_targets or args.out_md).write_text(targets_table(read_csv_rows(args.from_csv)))
        return
    start, load_before = time.perf_counter(), os.getloadavg()
    print(f"bench: {machine_info()}", flush=True)
    rows = measure(args)
    if args.keep_skipped and args.out_csv.exists():  # the earlier run's machine row goes: this run's is first
        kept = [r for r in read_csv_rows(args.out_csv) if r["section"] in args.skip]
        rows = rows[:1] + kept + rows[1:]
    elapsed = time.perf_counter() - start
    header = [f"- machine: {machine_info()}",
              f"- mode: {'--quick' if args.quick else 'full'}; {args.reps} timed repetitions per candidate after "
              f"{args.warmup} warm-up; dims {', '.join(args.dims)}; threads {args.threads}; "
              f"resume file of the {args.io_dims} model",
              f"- load average (1/5/15 min) at start {'/'.join(f'{x:.2f}' for x in load_before)}, at end "
              f"{'/'.join(f'{x:.2f}' for x in os.getloadavg())}; the run took {elapsed:.0f} s",
              f"- command: `python bench/bench.py {' '.join(sys.argv[1:])}`"]
    if args.keep_skipped:
        header.append(f"- rows of {', '.join(sorted(args.skip))}: kept from the earlier run's CSV (their own "
                      "repetitions and machine state), not measured by this command")
    write_csv(rows, args.out_csv)
    args.out_md.parent.mkdir(parents=True, exist_ok=True)
    args.out_md.write_text(render_markdown(rows, header))
    targets = targets_table(rows)
    if args.out_targets:
        args.out_targets.write_text(targets)
    print(f"bench: wrote {args.out_csv} and {args.out_md} after {elapsed:.0f} s; the targets:\n\n{targets}", flush=True)


if __name__ == "__main__":
    main()
