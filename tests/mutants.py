"""make mutants: break the code on purpose, one named breakage at a time, and check that a test catches it.

For each breakage: copy the tracked files to a temporary folder, replace one snippet of one file (it must
occur exactly once, so a refactor that moves it fails here loudly), run the tests named for it there, and
count it caught when they fail. A tiny pipeline built once by the unbroken code is shared with breakages
whose tests only read its inputs (tokens, settings, a resume file to edit); the others build their own.

  python tests/mutants.py            # every breakage; exit 1 if any is missed
  python tests/mutants.py -k digest  # those whose name contains 'digest'
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
M = "workflow/scripts/mmkit/"
T = "tests/"


@dataclass
class Breakage:
    name: str
    file: str
    old: str
    new: str
    tests: tuple
    shared: bool = True  # the tests may read a pipeline built by the unbroken code


CONTENTS = T + "test_resume_contents.py::test_resume_file_with_bad_contents_is_refused_naming_the_entry"
ORDER = T + "test_durability.py::test_a_save_writes_flushes_fsyncs_the_file_renames_then_fsyncs_the_directory"
CHAIN = T + "test_resume_points.py::test_a_chain_of_resumes_gives_the_straight_weights"
PRE = T + "test_preemption.py::"
DIST = T + "test_dist.py::"
MINIMIND = T + "test_minimind_path.py::"
STEP = T + "test_step_options.py::"
BREAKAGES = [
    # checkpoint I/O
    Breakage("atomic: no fsync of the file", M + "atomic.py", "            os.fsync(f.fileno())\n", "", (ORDER,)),
    Breakage("atomic: no flush before the fsync", M + "atomic.py", "            f.flush()\n            os.fsync",
             "            os.fsync", (ORDER,)),
    Breakage("atomic: no fsync of the directory", M + "atomic.py", "    fsync_path(path.parent)  # the rename",
             "    None  # the rename",
             (ORDER,)),
    Breakage("atomic: written in place, no .tmp", M + "atomic.py", 'tmp = path.with_name(path.name + ".tmp")',
             "tmp = path", (ORDER,)),
    Breakage("load: weights_only=False", M + "checkpoint.py", "weights_only=True)", "weights_only=False)",
             (T + "test_bad_input.py::test_pickle_that_would_run_code_is_refused_and_never_runs",)),
    # the loop and its resume path, the data position
    Breakage("resume: generator state not restored", "workflow/scripts/run.py",
             '        batch_generator.set_state(state["gen_state"])', "        pass", (CHAIN,)),
    Breakage("resume: optimizer state not loaded", "workflow/scripts/run.py",
             '            optimizer.load_state_dict(state["optimizer"])', "            pass", (CHAIN,)),
    Breakage("loop: LR from the step counted in this process", M + "train.py",
             "lr = lr_at(micro - schedule_offset,", "lr = lr_at(micro - plan.consumed(first_step - 1) - schedule_offset,",
             (CHAIN,)),
    Breakage("loop: no trailing step at an epoch's end (a window runs into the next epoch)", M + "data.py",
             "min((window + 1) * a, m)", "(window + 1) * a", (MINIMIND + "test_the_steps_follow_minimind_accumulation_and_trailing_step",)),
    Breakage("resume: the RNG state (dropout) not restored", "workflow/scripts/run.py",
             '        set_global_rng_state(state["rng_state"])', "        pass", (MINIMIND + "test_resumed_equals_straight_with_2_and_with_0_workers",)),
    Breakage("epoch order: consumed batches not skipped on resume", M + "data.py",
             "batch_sampler=self.batches_of(epoch)[skip:]", "batch_sampler=self.batches_of(epoch)",
             (MINIMIND + "test_resumed_equals_straight_with_2_and_with_0_workers",)),
    Breakage("data: targets not shifted by one", M + "data.py", "tokens[i + 1 : i + 1 + seq_len]",
             "tokens[i : i + seq_len]", (T + "test_pipeline.py::test_targets_are_the_inputs_shifted_by_one",)),
    Breakage("resume file: data position not saved", M + "checkpoint.py", '"gen_state": generator.get_state(),',
             '"gen_state": torch.Generator().get_state(),', (CHAIN,)),
    Breakage("ablation: noskip does not rewind the data", "workflow/scripts/run.py",
             "        batch_generator.manual_seed(cfg.seed)  #", '        batch_generator.set_state(state["gen_state"])  #',
             (T + "test_pipeline.py::test_every_ablation_silently_changes_the_result",), False),
    Breakage("ablation: halfresume keeps fp32 weights", "workflow/scripts/halve_resume.py",
             '"model": cast_state_dict(state["model"], torch.float16)', '"model": state["model"]',
             (T + "test_pipeline.py::test_halfresume_resumes_from_fp16_weights_and_drifts_least",), False),
    Breakage("loop: NaN trains on", M + "train.py", 'if not finite and cfg.nonfinite == "stop":', "if False:",
             (T + "test_resume_contents.py::test_a_nan_loss_stops_training_with_its_own_exit_and_writes_nothing",)),
    # the fingerprint
    Breakage("fingerprint: threads left out", M + "train.py", '        "threads": cfg.threads,\n', "",
             (T + "test_resume_contents.py::test_a_resume_file_records_every_setting_the_continuation_depends_on",)),
    Breakage("fingerprint: nested keys not compared", M + "checkpoint.py",
             'diffs += fingerprint_diff(a, b, f"{prefix}{k}.")', "pass",
             (T + "test_resume_contents.py::test_a_resume_file_from_other_settings_is_refused_for_each_fingerprint_key"
                  "[model.hidden_size]",)),
    # validation of a resume file's contents, and of inputs
    Breakage("check: empty optimizer state let through", M + "checkpoint.py",
             "if set(state) != set(range(len(params))) or", "if False and", (CONTENTS + "[empty-optimizer]",)),
    Breakage("check: ties not compared", M + "checkpoint.py",
             'if not torch.equal(state["model"][name], state["model"][tied_to]):', "if False:",
             (CONTENTS + "[untied]",)),
    Breakage("check: data position not replayed", M + "checkpoint.py", "        if not torch.equal(g, expected):",
             "        if False:", (CONTENTS + "[gen-other-seed]",)),
    Breakage("check: digests not compared", M + "checkpoint.py",
             'if k not in ignore and digest(state[k]) != state["digests"].get(k):', "if False:",
             (CONTENTS + "[nudged-weight]", CONTENTS + "[scaled-exp-avg]")),
    Breakage("check: step range off by one", M + "checkpoint.py", "if not 1 <= step < last_step:",
             "if not 1 <= step <= last_step:", (CONTENTS + "[step-12]",)),
    Breakage("tokens: id range off by one", M + "data.py", "if lo < 0 or hi >= vocab_size:",
             "if lo < 0 or hi > vocab_size:",
             (T + "test_bad_input.py::test_token_ids_at_the_edges_of_the_vocabulary",)),
    Breakage("config: an undeclared key reads as None", M + "config.py",
             "        if name not in self._values:\n            raise UserError(",
             "        if name not in self._values:\n            return None\n            raise UserError(",
             (T + "test_invalidation.py::test_a_job_reading_an_undeclared_key_fails_before_any_step",)),
    Breakage("compare: NaN/Inf hidden in the max", M + "checkpoint.py",
             "elif count_nonfinite(a[k]) or count_nonfinite(b[k]):", "elif False:",
             (T + "test_resume_contents.py::test_compare_reports_nan_and_never_a_finite_max_around_it",)),
    # several ranks
    Breakage("ranks: every rank trains the first slices", M + "parallel.py",
             "first = 0 if self.rank_generators else self.rank * self.slices_per_rank", "first = 0",
             (DIST + "test_promised_pairs_are_bit_identical[reshard_1to2]",)),
    Breakage("ranks: another world size continued without --reshard", M + "checkpoint.py",
             "if layout and not (reshard or allow_mismatch):", "if False:",
             (DIST + "test_another_world_size_needs_reshard",)),
    Breakage("dcp: the manifest's sha256 not compared", M + "sharded.py", "if sha256_file(f) != manifest[name]:",
             "if False:", (DIST + "test_a_damaged_resume_directory_is_refused_whole[truncated-shard]",)),
    Breakage("dcp: .metadata through pickle.load", M + "sharded.py", "metadata = _MetadataUnpickler(f).load()",
             "metadata = pickle.load(f)", (DIST + "test_a_metadata_pickle_that_runs_code_is_refused",)),
    Breakage("dcp: shards written into the final directory", M + "sharded.py",
             "dcp.save(shards, checkpoint_id=str(tmp))", "dcp.save(shards, checkpoint_id=str(path))",
             (DIST + "test_a_rank_killed_in_the_middle_of_a_dcp_save_leaves_the_previous_directory",)),
    # the step's options (their own bits, their own fingerprint entry)
    Breakage("adamw: the kernel setting ignored", M + "train.py", "WEIGHT_DECAY, **ADAMW_KERNELS[cfg.adamw])",
             "WEIGHT_DECAY)", (STEP + "test_each_step_option_resumes_bit_exactly_and_has_its_own_bits[forloop]",),
             False),
    Breakage("attention written out: no causal mask", M + "model.py",
             "    scores = scores + torch.full((t, t), float(\"-inf\"), device=scores.device).triu(1)\n", "",
             (STEP + "test_attention_written_out_computes_what_sdpa_computes",)),
    Breakage("precision auto: bf16 on AVX512-BF16 alone", M + "hardware.py", 'return "bf16" if "amx_bf16" in',
             'return "bf16" if "avx512_bf16" in', (STEP + "test_precision_auto_follows_the_amx_flag",)),
    Breakage("bench targets: peak memory in GiB, not GB", "bench/tables.py", 'mem["peak_rss_mib"] * 2**20 / 1e9',
             'mem["peak_rss_mib"] / 1024', (T + "test_bench_tables.py",)),
    # preemption: the checkpoint folder, auto-resume, signals
    Breakage("auto-resume: origin not compared", "workflow/scripts/run.py", "if state[\"origin\"] != origin:",
             "if False:", (PRE + "test_a_resumed_ablation_never_takes_the_checkpoints_of_another_ablation",)),
    Breakage("auto-resume: the loss log of the checkpoint dropped", "workflow/scripts/run.py",
             "[tuple(row) for row in state[\"loss_log\"]]", "[]",
             (PRE + "test_a_torn_newest_checkpoint_is_skipped_by_name_and_the_older_one_used",)),
    Breakage("checkpoints: prune removes the newest", M + "autoresume.py", "self.checkpoints()[self.cfg.keep:]",
             "self.checkpoints()[::-1][self.cfg.keep:]",
             (PRE + "test_keep_leaves_the_newest_checkpoints_and_keep_when_done_keeps_the_folder",)),
    Breakage("preemption: the signal's handler does nothing", M + "autoresume.py",
             "        if self.received is None:\n", "        if False:\n",
             (PRE + "test_sigusr1_then_a_second_signal_during_the_save_checkpoints_once_and_whole",)),
    # the numbers of the report, and the export
    Breakage("divergence: rel. L2 without the square root", "workflow/scripts/divergence.py",
             "(sq / norm) ** 0.5", "sq / norm",
             (T + "test_pipeline.py::test_every_number_in_the_summary_is_recomputed_from_the_artifacts",), False),
    Breakage("report: val loss of straight in every row", M + "report.py",
             "/ {g(row['max_abs_loss_gap'])} | {row['val_loss']:.4f} |",
             "/ {g(row['max_abs_loss_gap'])} | {rows['straight']['val_loss']:.4f} |",
             (T + "test_pipeline.py::test_every_number_in_the_summary_is_recomputed_from_the_artifacts",), False),
    Breakage("export: wrong RMSNorm eps", M + "export.py", '"rms_norm_eps": cfg.rms_norm_eps,',
             '"rms_norm_eps": 1e-6,', (T + "test_inference_export.py",)),
    Breakage("export: untied head let through", M + "export.py", "raise UserError(\"lm_head.weight differs",
             "return None or UserError(\"lm_head.weight differs",
             (T + "test_inference_export.py::test_export_refuses_weights_whose_head_is_not_tied",)),
]


def tracked_copy(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    for f in files:
        if (REPO / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, dest / f)
    return dest


def build_shared_pipeline(dest: Path) -> Path:
    sys.path.insert(0, str(REPO / "tests"))
    import yaml
    from conftest import TINY, copy_workflow, snakemake

    work = copy_workflow(dest)
    (work / "tiny.yaml").write_text(yaml.safe_dump({**TINY, "outdir": "results"}))
    snakemake(work)
    return work


def run_breakage(b: Breakage, root: Path, shared: Path) -> tuple[bool, float, str]:
    work = tracked_copy(root / "code")
    target = work / b.file
    text = target.read_text()
    if text.count(b.old) != 1:
        raise SystemExit(f"mutants: '{b.name}': the snippet occurs {text.count(b.old)} times in {b.file}")
    target.write_text(text.replace(b.old, b.new))
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("MMKIT_SHARED_PIPELINE", None)
    env.pop("CI", None)  # under CI=true a skipped test fails: a skip must not count as a breakage caught
    if b.shared:
        env["MMKIT_SHARED_PIPELINE"] = str(shared)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                           "--basetemp", str(root / "tmp"), *b.tests], cwd=work, env=env, capture_output=True,
                          text=True)
    seconds = time.perf_counter() - t0
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    # caught: the tests ran and failed (exit 1); collection errors or no tests (2..5) say nothing
    return proc.returncode == 1, seconds, last


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-k", default="", help="only breakages whose name contains this")
    p.add_argument("-j", type=int, default=2, help="breakages tried at once (each in its own folder)")
    args = p.parse_args()
    chosen = [b for b in BREAKAGES if args.k in b.name]
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        tmp = Path(tmp)
        print("building the shared tiny pipeline with the unbroken code ...", flush=True)
        shared = build_shared_pipeline(tmp / "shared")

        def attempt(i, b):
            root = tmp / f"m{i}"
            root.mkdir()
            caught, seconds, last = run_breakage(b, root, shared)
            print(f"{'caught' if caught else 'MISSED'}  {seconds:5.1f} s  {b.name}  [{last}]", flush=True)
            shutil.rmtree(root, ignore_errors=True)
            return b, caught, seconds

        # most of a breakage's time is one process waiting for another: two at a time use both cores
        with ThreadPoolExecutor(args.j) as pool:
            results = list(pool.map(attempt, range(len(chosen)), chosen))
    caught = sum(c for _, c, _ in results)
    print(f"\nscore: {caught} of {len(results)} breakages caught, in {time.perf_counter() - t_all:.0f} s")
    print("slowest: " + "; ".join(f"{b.name} {s:.0f} s" for b, _, s in sorted(results, key=lambda r: -r[2])[:3]))
    for b, c, _ in results:
        if not c:
            print(f"missed: {b.name} ({b.file}; tests {', '.join(b.tests)})")
    sys.exit(0 if caught == len(results) else 1)


if __name__ == "__main__":
    main()
