"""make mutants: break the code on purpose, one named breakage at a time, and check that a test catches it.

For each breakage: copy the tracked files to a temporary folder, replace one snippet inside one function of
one file, run the tests named for it there (the cheapest that catch it), and count it caught when one of them
fails on an assertion. Only if every named test passes do the whole files they are in run, and then a catch
counts only from a test that passed in make test's run of the unbroken tree.

Measured against a baseline: the named tests first run on the unbroken code (once per distinct set of
tests, all in one pytest run); a test that fails or skips there fails the whole check instead of counting as
a catch. And only an assertion counts: a test that fails in its call phase on an AssertionError or a
pytest.fail (pytest.raises' "DID NOT RAISE" included). A setup error (a fixture's traceback, a pipeline the
broken code cannot build) or another exception in the test says only that something broke, not that a test
checks it; such a breakage is reported MISSED with what did happen.

A tiny pipeline built once by the unbroken code is shared with the baseline and every breakage: as is with
those whose tests only read its inputs (tokens, settings, a resume file to edit); for the others, the
artifacts their tests read are brought up to date by snakemake with the broken code (only the jobs that
lead to them and that code feeds rerun).

  python tests/mutants.py            # every breakage; exit 1 if any is missed or a baseline fails
  python tests/mutants.py -k digest  # those whose name matches 'digest' (a regular expression)
  python tests/mutants.py --list     # the table: name, where, tests
"""

import argparse
import ast
import importlib.util
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from outcomes import OUTCOMES, RECORD, REPO, STOP, TEST_RECORD, tracked_files, tree_digest

M = "src/mmkit/"
AUDIT = "src/trainer_audit/"
C = "certify/src/certkit/"  # certify's distribution: its copy comes first on PYTHONPATH (run_tests)
T = "tests/"
CI = "certify/tests/test_ci.py::"
CRASH = "certify/tests/test_crash.py::"
DIAGNOSIS = T + "test_diagnosis.py::test_each_cause_is_named_with_its_evidence_and_the_users_line"


@dataclass
class Breakage:
    name: str
    file: str
    function: str  # "name", "Class.method" (or "outer.inner"), or "<module>" for the whole file
    old: str  # occurs exactly once inside that function
    new: str
    tests: tuple
    rebuild: tuple = ()  # the artifacts the tests read that the broken code builds differently (see below)


CONTENTS = T + "test_resume_contents.py::test_resume_file_with_bad_contents_is_refused_naming_the_entry"
DIGEST = T + "test_resume_contents.py::test_an_edit_no_check_sees_is_refused_by_the_digest"
CRASH_CELL = T + "test_audit.py::test_a_crash_cell_resumes_through_the_frameworks_auto_resume_and_is_counted_apart"
REFUSED = T + "test_audit.py::test_a_refused_resume_or_a_scenario_the_script_cannot_run_is_the_cells_result"
AUDIT_API = T + "test_architecture.py::test_the_audit_declares_no_piece_of_certify_and_tells_failures_apart_by_type"
MOVED_IN = T + "test_crash_states.py::test_a_file_moved_in_from_outside_the_root_is_recorded_as_made_there_and_renamed_in"
ORDER = T + "test_durability.py::test_a_save_writes_flushes_fsyncs_the_file_renames_then_fsyncs_the_directory"
CHAIN = T + "test_resume_points.py::test_a_chain_of_resumes_gives_the_straight_weights"
PRE = T + "test_preemption.py::"
DIST = T + "test_dist.py::"
MINIMIND = T + "test_minimind_path.py::"
STEP = T + "test_step_options.py::"
ASYNC = T + "test_async_checkpoints.py::"
REUSED = (T + "test_certify.py::test_a_straight_run_is_reused_only_for_the_same_command_keeping_as_much_and_unchanged",)
# One row per breakage: Breakage(name, file, function, old, new, tests, rebuild=()).
#   function: where OLD lives, found with ast: "name", "Class.method", or "<module>" (the whole file). OLD must
#             occur exactly once in that function's source, so a function moved within its file still matches,
#             and a refactor that renames it or edits the snippet fails here loudly, before anything runs.
#   tests:    pytest ids (a file, a test, or one parametrization); one of them must fail on an assertion.
#   rebuild:  the artifacts (snakemake targets) the tests read that the broken code would build differently:
#             then they get a copy of the shared pipeline where snakemake brings those targets up to date,
#             rerunning the jobs that lead to them whose code (the broken file) is newer than their outputs.
#             Only those: the tests read nothing else that the broken code builds.
BREAKAGES = [
    # checkpoint I/O
    Breakage("atomic: no fsync of the file", M + "atomic.py", "write_atomic", "            os.fsync(f.fileno())\n",
             "", (ORDER,)),
    Breakage("atomic: no flush before the fsync", M + "atomic.py", "write_atomic",
             "            f.flush()\n            os.fsync", "            os.fsync", (ORDER,)),
    Breakage("atomic: no fsync of the directory", M + "atomic.py", "write_atomic",
             "    fsync_path(path.parent)  # the rename", "    None  # the rename", (ORDER,)),
    Breakage("atomic: written in place, no .tmp", M + "atomic.py", "write_atomic",
             'tmp = path.with_name(path.name + ".tmp")', "tmp = path", (ORDER,)),
    Breakage("load: weights_only=False", M + "checkpoint/files.py", "load_file", "weights_only=True)",
             "weights_only=False)",
             (T + "test_bad_input.py::test_pickle_that_would_run_code_is_refused_and_never_runs",)),
    # the loop and its resume path, the data position
    Breakage("resume: generator state not restored", M + "data.py", "GeneratorState.load_state_dict",
             "self.generator.set_state(state)", "None", (CHAIN,)),
    Breakage("resume: optimizer state not loaded", M + "checkpoint/entries.py", "AdamWState.load_state_dict",
             "self.optimizer.load_state_dict(state)", "None", (CHAIN,)),
    Breakage("loop: LR from the step counted in this process", M + "train.py", "train",
             "lr = lr_at(micro - schedule_offset,",
             "lr = lr_at(micro - plan.consumed(first_step - 1) - schedule_offset,", (CHAIN,)),
    Breakage("loop: no trailing step at an epoch's end (a window runs into the next epoch)", M + "data.py",
             "StepPlan.micro_batches", "min((window + 1) * a, m)", "(window + 1) * a",
             (MINIMIND + "test_the_steps_follow_minimind_accumulation_and_trailing_step",
              MINIMIND + "test_resumed_equals_straight_with_2_and_with_0_workers")),
    Breakage("resume: the RNG state (dropout) not restored", M + "checkpoint/entries.py", "GlobalRNG.load_state_dict",
             'torch.set_rng_state(state["cpu"])', "None",
             (MINIMIND + "test_resumed_equals_straight_with_2_and_with_0_workers",)),
    Breakage("epoch order: consumed batches not skipped on resume", M + "data.py", "EpochBatches.__iter__",
             "batch_sampler=self.batches_of(epoch)[skip:]", "batch_sampler=self.batches_of(epoch)",
             (MINIMIND + "test_resumed_equals_straight_with_2_and_with_0_workers",)),
    Breakage("data: targets not shifted by one", M + "data.py", "get_batch", "tokens[i + 1 : i + 1 + seq_len]",
             "tokens[i : i + seq_len]", (T + "test_pipeline.py::test_targets_are_the_inputs_shifted_by_one",)),
    Breakage("resume file: data position not saved", M + "data.py", "GeneratorState.state_dict",
             "return self.generator.get_state()", "return torch.Generator().get_state()", (CHAIN,)),
    Breakage("ablation: noskip does not rewind the data", M + "ablations.py", "from_the_start",
             "    live.batch_generator.manual_seed(expected.seed)  #",
             '    live.batch_generator.set_state(saved["gen_state"])  #',
             (T + "test_pipeline.py::test_every_ablation_silently_changes_the_result[noskip]",),
             ("results/straight.pth", "results/noskip.pth")),
    Breakage("ablation: halfresume keeps fp32 weights", "workflow/scripts/halve_resume.py", "main",
             '"model": cast_state_dict(state["model"], torch.float16)', '"model": state["model"]',
             (T + "test_bad_input.py::test_a_resume_file_with_halved_weights_is_refused_unless_allow_mismatch",)),
    Breakage("loop: NaN trains on", M + "train.py", "update", 'if not finite and cfg.nonfinite == "stop":',
             "if False:",
             (T + "test_resume_contents.py::test_a_nan_loss_stops_training_with_its_own_exit_and_writes_nothing",)),
    # the fingerprint
    Breakage("fingerprint: threads left out", M + "fingerprint.py", "build", '        "threads": cfg.threads,\n', "",
             (T + "test_resume_contents.py::test_a_resume_file_records_every_setting_the_continuation_depends_on",)),
    Breakage("fingerprint: the CPU kernel dispatch left out", M + "fingerprint.py", "build",
             '        "cpu_capability": torch.backends.cpu.get_cpu_capability(),\n', "",
             (T + "test_bad_input.py::test_a_resume_under_another_cpu_kernel_dispatch_is_refused_naming_it",)),
    Breakage("fingerprint: the code hashed with its comments", M + "fingerprint.py", "code_digests",
             "if t.type not in (tokenize.COMMENT, tokenize.NL)", "if True",
             (T + "test_bad_input.py::test_a_resume_from_other_training_code_is_refused_naming_the_module",)),
    Breakage("a bad command line answered with argparse's usage block", M + "errors.py", "OneLineParser.error",
             'self.exit(2, f"error: {self.prog}: {message} (--help lists the options)\\n")',
             "super().error(message)",
             (T + "test_bad_input.py::test_any_malformed_command_line_of_run_py_is_one_line_and_exit_2_and_nothing_is"
                  "_written",)),
    Breakage("fingerprint: nested keys not compared", M + "fingerprint.py", "diff",
             'diffs += diff(a, b, f"{prefix}{k}.")', "pass",
             (T + "test_resume_contents.py::test_a_resume_file_from_other_settings_is_refused_for_each_fingerprint_key"
                  "[model.hidden_size]",)),
    # validation of a resume file's contents, and of inputs
    Breakage("check: empty optimizer state let through", M + "checkpoint/entries.py", "check_optimizer_state",
             "if set(state) != set(range(len(params))) or", "if False and", (CONTENTS + "[empty-optimizer]",)),
    Breakage("check: ties not compared", M + "checkpoint/entries.py", "check_weights",
             "if not torch.equal(weights[name], weights[tied_to]):", "if False:",
             (CONTENTS + "[untied]",)),
    Breakage("check: data position not replayed", M + "data.py", "GeneratorState.check",
             "        if not torch.equal(g, expected):", "        if False:", (CONTENTS + "[gen-other-seed]",)),
    Breakage("check: digests not compared", M + "checkpoint/entries.py", "check",
             'if name not in skip and digest(saved[name]) != saved["digests"].get(name):', "if False:",
             (DIGEST + "[nudged-weight]", DIGEST + "[scaled-exp-avg]")),
    Breakage("check: skipped steps beyond the step let through", M + "checkpoint/entries.py", "check_skipped_steps",
             "if not 0 <= skipped <= saved[\"step\"]:", "if False:", (CONTENTS + "[skipped-past-step]",)),
    Breakage("check: data position not compared with the step's", M + "data.py", "DataPosition.check",
             "if position != expected:", "if False:", (CONTENTS + "[data-position-ahead]",)),
    Breakage("check: an RNG state of another shape let through", M + "checkpoint/entries.py", "check_rng_state",
             "and t.shape == now[device].shape", "", (CONTENTS + "[rng-truncated]",)),
    Breakage("check: a GradScaler state taken by a run without fp16", M + "checkpoint/entries.py", "check_scaler_state",
             "        if saved is not None:\n", "        if False:\n", (CONTENTS + "[scaler-without-fp16]",)),
    Breakage("check: loss log rows not consecutive", M + "checkpoint/entries.py", "check_loss_log",
             "if row[0] != step - len(rows) + 1 + i:", "if False:", (CONTENTS + "[loss-log-reversed]",)),
    Breakage("check: an older format refused by the entry it lacks, not its version", M + "checkpoint/entries.py",
             "check_types", "        fingerprint.check_format(", "        (lambda *a: None)(",
             (CONTENTS + "[older-format-lacking-an-entry]",)),
    Breakage("check: step range off by one", M + "checkpoint/entries.py", "check_step", "if not 1 <= step < ctx.expected.last_step:",
             "if not 1 <= step <= ctx.expected.last_step:", (CONTENTS + "[step-12]",)),
    Breakage("tokens: id range off by one", M + "data.py", "load_tokens", "if lo < 0 or hi >= vocab_size:",
             "if lo < 0 or hi > vocab_size:",
             (T + "test_bad_input.py::test_token_ids_at_the_edges_of_the_vocabulary",)),
    Breakage("config: an undeclared key reads as None", M + "config.py", "Settings.__getattr__",
             "        if name not in self._values:\n            raise UserError(",
             "        if name not in self._values:\n            return None\n            raise UserError(",
             (T + "test_invalidation.py::test_a_job_reading_an_undeclared_key_fails_before_any_step",)),
    Breakage("compare: NaN/Inf hidden in the max", M + "checkpoint/files.py", "compare_state_dicts",
             "elif count_nonfinite(a[k]) or count_nonfinite(b[k]):", "elif False:",
             (T + "test_resume_contents.py::test_compare_reports_nan_and_never_a_finite_max_around_it",)),
    # several ranks
    Breakage("ranks: every rank trains the first slices", M + "parallel.py", "Ranks.micro_batches",
             "first = 0 if self.rank_generators else self.rank * self.slices_per_rank", "first = 0",
             (DIST + "test_promised_pairs_are_bit_identical[reshard_1to2]",)),
    Breakage("ranks: another world size continued without --reshard", M + "fingerprint.py", "check",
             "if layout and not (reshard or allow_mismatch):", "if False:",
             (DIST + "test_another_world_size_needs_reshard",)),
    Breakage("dcp: the manifest's sha256 not compared", M + "checkpoint/dcp.py", "read_resume_dir",
             "if sha256_file(f) != manifest[name]:", "if False:",
             (DIST + "test_a_damaged_resume_directory_is_refused_whole[truncated-shard]",)),
    Breakage("dcp: .metadata through pickle.load", M + "checkpoint/dcp.py", "_SafeReader.read_metadata",
             "metadata = read_metadata(f, f\"resume directory {self.path}\")",
             "metadata = pickle.load(f)",
             (DIST + "test_the_dcp_reader_refuses_a_metadata_pickle_that_runs_code",)),
    Breakage("dcp: a value's pickle through torch.load without weights_only", M + "checkpoint/dcp.py",
             "_SafeLoadPlanner.load_bytes", "torch.load(value, weights_only=True)",
             "torch.load(value, weights_only=False)",
             (DIST + "test_the_dcp_load_planner_refuses_a_value_pickle_that_runs_code",)),
    Breakage("dcp: shards written into the final directory", M + "checkpoint/dcp.py", "save_resume_dir",
             "dcp.save(shards, checkpoint_id=str(tmp))", "dcp.save(shards, checkpoint_id=str(path))",
             (DIST + "test_a_rank_killed_in_the_middle_of_a_dcp_save_leaves_the_previous_directory",)),
    # the step's options (their own bits, their own fingerprint entry)
    # straight.pth rebuilt: the pipeline's is brought up to date by the broken code, whose straight run then ignores
    # adamw: fused as the forloop run does (torch's default on CPU), so "its own bits" fails. Against the
    # unbroken pipeline's fused bits the forloop run would differ and pass
    Breakage("adamw: the kernel setting ignored", M + "train.py", "build",
             "WEIGHT_DECAY, **ADAMW_KERNELS[cfg.adamw])", "WEIGHT_DECAY)",
             (STEP + "test_each_step_option_resumes_bit_exactly_and_has_its_own_bits[forloop]",),
             ("results/straight.pth",)),
    Breakage("attention written out: no causal mask", M + "model.py", "causal_attention",
             "    scores = scores + torch.full((t, t), float(\"-inf\"), device=scores.device).triu(1)\n", "",
             (STEP + "test_attention_written_out_computes_what_sdpa_computes",)),
    Breakage("precision auto: bf16 on AVX512-BF16 alone, Intel's too", M + "hardware.py", "resolve_precision",
             '(vendor == "AuthenticAMD" and "avx512_bf16" in flags)', '("avx512_bf16" in flags)',
             (STEP + "test_precision_auto_follows_the_machines_where_bf16_was_measured_faster",)),
    # background checkpoints and the auto interval
    Breakage("async: the snapshot holds the live tensors", M + "checkpoint/files.py", "host_snapshot",
             "            s = x.untyped_storage()\n", "            return x\n",
             (ASYNC + "test_a_snapshot_saves_as_its_source_did_and_training_no_longer_changes_it",)),
    Breakage("async: the snapshot drops a state_dict's _metadata", M + "checkpoint/files.py", "host_snapshot",
             "                if getattr(x, \"__dict__\", None):", "                if False:",
             (ASYNC + "test_a_background_save_writes_the_bytes_of_a_foreground_save",)),
    Breakage("every auto: the first checkpoint never comes", M + "checkpoint/manager.py", "AutoInterval.due",
             "return self.steps >= 2", "return False",
             (ASYNC + "test_every_auto_checkpoints_as_the_measured_costs_allow_and_changes_no_bit",)),
    Breakage("bench targets: peak memory in GiB, not GB", "bench/tables.py", "targets_table",
             'mem["peak_rss_mib"] * 2**20 / 1e9', 'mem["peak_rss_mib"] / 1024',
             (T + "test_bench_tables.py::test_the_speed_doc_shows_the_targets_table_the_csv_gives",)),
    Breakage("dcp: shards loaded unchecked", M + "checkpoint/dcp.py", "load_sharded",
             "refusal = loaded_refusal(state, built_groups, updates)", "refusal = None",
             (DIST + "test_a_resume_directory_with_bad_contents_is_refused_naming_the_entry[other-betas]",
              DIST + "test_a_resume_directory_with_bad_contents_is_refused_naming_the_entry[nan-weight]")),
    Breakage("dcp: the shards' dtypes not compared", M + "checkpoint/dcp.py", "check_dtypes",
             "if want is not None and", "if False and",
             (DIST + "test_a_resume_directory_with_bad_contents_is_refused_naming_the_entry[float64-weight]",)),
    Breakage("dcp: the directory's entries not fsynced before its rename", M + "checkpoint/dcp.py", "_commit",
             "    fsync_path(tmp)\n", "",
             (T + "test_crash_states.py::test_every_crash_state_of_every_save_continues_from_a_committed_checkpoint"
                  "[dcp]",)),
    Breakage("crash model: a rename durable at once (SIGKILL's model, not a power loss's)", C + "crashstates.py",
             "forced", 'result.append(any(o.kind == "fsync_dir" and o.path == op.directory for o in later))',
             "result.append(True)",
             (T + "test_crash_states.py::test_the_persistence_model_loses_what_no_fsync_made_durable",
              T + "test_crash_states.py::test_each_control_fails_every_committing_save_for_its_own_reason"
                  "[no-dir-fsync-lost]")),
    Breakage("crash model: a write durable at once (no torn file after a power loss)", C + "crashstates.py",
             "forced", 'result.append(any(o.kind == "fsync" and o.inode == op.inode for o in later))',
             "result.append(True)",
             (T + "test_crash_states.py::test_each_control_fails_every_committing_save_for_its_own_reason"
                  "[no-file-fsync-torn]",)),
    Breakage("crash recorder: a file moved into the root from outside it not recorded (Lightning's saves)",
             C + "crashstates.py", "Recorder._rename_as.rename", "if s is None and d is not None and not self.quiet:",
             "if False:", (MOVED_IN,)),
    Breakage("crash recorder: the name outside the root a moved-in file was made at shown in the states",
             C + "crashstates.py", "materialize", "return {p: v for p, v in tree.items() if not p.startswith(OUTSIDE)}",
             "return tree", (MOVED_IN,)),
    Breakage("crash recorder: an fsync of a file outside the root forgotten when it is moved in",
             C + "crashstates.py", "Recorder._fsync", "self.synced_outside.add((st.st_dev, st.st_ino))", "pass",
             (MOVED_IN,)),
    Breakage("dcp: the swap moves the committed directory aside before the new one's entry is durable",
             M + "checkpoint/dcp.py", "_commit", "    fsync_path(path.parent)  # the new directory's own entry", "    pass  #",
             (T + "test_crash_states.py::test_every_crash_state_of_every_save_continues_from_a_committed_checkpoint"
                  "[dcp_resave]",)),
    # preemption: the checkpoint folder, auto-resume, signals
    Breakage("auto-resume: origin not compared", M + "checkpoint/manager.py", "auto_resume",
             'if saved["origin"] != live.origin:', "if False:",
             (PRE + "test_a_resumed_ablation_never_takes_the_checkpoints_of_another_ablation",)),
    Breakage("auto-resume: the loss log of the checkpoint dropped", M + "checkpoint/entries.py", "LossLog.load_state_dict",
             "[tuple(row) for row in rows]", "[]",
             (PRE + "test_a_torn_newest_checkpoint_is_skipped_by_name_and_the_older_one_used",)),
    Breakage("checkpoints: prune removes the newest", M + "checkpoint/folder.py", "CheckpointDir.prune",
             "self.checkpoints()[self.cfg.keep:]", "self.checkpoints()[::-1][self.cfg.keep:]",
             (PRE + "test_keep_leaves_the_newest_checkpoints_and_keep_when_done_keeps_the_folder",)),
    Breakage("checkpoints: another run's count among the newest kept", M + "checkpoint/manager.py", "auto_resume",
             "            checkpoints.reject(path)\n", "",
             (PRE + "test_checkpoints_of_another_run_are_named_never_resumed_and_never_push_out_this_runs_own",)),
    Breakage("auto-resume: AdamW's counter taken as the step's after --no-optim", M + "checkpoint/manager.py", "resume",
             "    live.adamw_offset = live.step", "    live.adamw_offset = 0 * live.step",
             (PRE + "test_a_no_optim_job_killed_after_its_own_checkpoints_continues_from_them",
              DIST + "test_a_minimind_rescale_job_killed_after_its_own_checkpoints_continues_from_them")),
    Breakage("auto-resume: each rank's own verdict on a checkpoint", M + "checkpoint/manager.py", "auto_resume",
             "refused = ranks.any(refusal is not None)", "refused = refusal is not None",
             (PRE + "test_a_checkpoint_one_rank_refuses_is_skipped_by_every_rank",)),
    Breakage("torchrun: SIGUSR1 not passed on", "workflow/scripts/torchrun.py", "<module>",
             'SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"', 'SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"',
             (PRE + "test_a_signal_to_torchrun_checkpoints_every_ddp_rank_after_the_same_step_and_exits_75[SIGUSR1]",)),
    Breakage("torchrun: a preempted job exits 1", "workflow/scripts/torchrun.py", "verdict",
             "code = PREEMPTED if preempted else 0", "code = 1 if preempted else 0",
             (DIST + "test_snakemakes_retry_continues_a_ddp_job_whose_rank_was_preempted",)),
    Breakage("torchrun: a rank that failed in its checkpoint reported as preempted", "workflow/scripts/torchrun.py",
             "verdict", "if code not in (0, PREEMPTED) and not", "if False and not",
             (PRE + "test_torchrun_exits_75_only_when_every_rank_was_preempted",)),
    Breakage("preemption: the signal's handler does nothing", M + "preemption.py", "Preemption._note",
             "        if self.received is None:\n", "        if False:\n",
             (PRE + "test_sigusr1_then_a_second_signal_during_the_save_checkpoints_once_and_whole",)),
    # the numbers of the report, and the export
    Breakage("divergence: rel. L2 without the square root", "workflow/scripts/divergence.py", "weight_gap",
             "(sq / norm) ** 0.5", "sq / norm",
             (T + "test_pipeline.py::test_every_number_in_the_summary_is_recomputed_from_the_artifacts",),
             ("results/summary.md",)),
    Breakage("report: val loss of straight in every row", M + "report.py", "summary_table",
             "/ {g(row['max_abs_loss_gap'])} | {row['val_loss']:.4f} |",
             "/ {g(row['max_abs_loss_gap'])} | {rows['straight']['val_loss']:.4f} |",
             (T + "test_pipeline.py::test_every_number_in_the_summary_is_recomputed_from_the_artifacts",),
             ("results/summary.md",)),
    # certify (certify/src/certkit)
    Breakage("certify: a daemon a run double-forked left running (no sweep of certify's descendants)", C + "runs.py",
             "execute", "processes.end_descendants(spared, owner=owner)", "None",
             (T + "test_certify_cli.py::test_a_daemon_that_each_run_double_forks_out_of_its_session_is_ended_with_the_run",)),
    Breakage("certify --repair: the straight run's inputs read but never put back", C + "recorder.py",
             "Recorder._replay_inputs", "ours.copy_(theirs)", "pass",
             (T + "test_certify.py::test_a_plain_loop_that_forgets_its_generator_is_named_samples_at_the_first_resumed_step",)),
    Breakage("certify --repair: each rank given rank 0's RNG states", C + "recorder.py", "Recorder._keep_or_restore_rng",
             'set_raw_rng_states(torch.load(self.restore_rng / f"rank{_rank()}.rng.pt"',
             'set_raw_rng_states(torch.load(self.restore_rng / "rank0.rng.pt"',
             (T + "test_certify.py::test_ddp_under_torchrun_that_forgets_rank_1s_rng_is_named_rank_1_rng_and_the_repair_confirms_it",)),
    Breakage("certify --control: the optimizer state never emptied", C + "recorder.py", "Recorder._take_row",
             "optimizer.state.clear()", "pass",
             (T + "test_certify.py::test_an_emptied_optimizer_state_is_named_optimizer_state_and_so_is_certifys_own_control",)),
    Breakage("certify --control: caught at any difference, whatever its step and piece", C + "runs.py", "controlled",
             "caught = any(rows.get(r, {}).get(step, {}).get(CONTROL_PIECE) != straight[r][step][CONTROL_PIECE]",
             "caught = first is not None or any(False",
             (T + "test_audit.py::test_a_control_is_caught_only_in_the_optimizer_at_the_step_after_the_cut_and_an_"
                  "unjudgeable_one_is_not",)),
    Breakage("certify --control: judged where the resume already differs at K + 1 (no inconclusive)", C + "runs.py",
             "controlled", "    if already is not None:", "    if False:",
             (T + "test_certify.py::test_weights_restored_from_fp16_are_named_the_parameters_the_step_starts_from",)),
    Breakage("certify: a file written before the straight run's first step refused as a shared checkpoint",
             C + "runs.py", "training_began", "return min(times) if times and None not in times else fallback",
             "return fallback", (T + "test_certify.py::test_data_every_run_prepares_before_training_is_no_shared_"
                                     "checkpoint[prepare_beside]",)),
    Breakage("certify: a cache that a variable names (HF_DATASETS_CACHE) taken for a shared checkpoint",
             C + "runs.py", "cache", "return named or any(", "return named and any(",
             (T + "test_certify.py::test_a_read_is_shared_when_written_after_the_first_step_outside_a_cache",)),
    Breakage("certify --again: the second resume from the cut's checkpoint, not its own", C + "runs.py",
             "resumed_legs", 'runs.run("resumed", resuming, "resumed", again or stop_after,',
             'runs.run("resumed", resuming, "resumed", stop_after,',
             (T + "test_certify.py::test_a_plain_loop_that_forgets_its_generator_is_named_samples_at_the_first_resumed_step",)),
    Breakage("audit releases: the first exact release taken for the fix, a later regression ignored", AUDIT + "audit.py",
             "first_exact", 'while later > 0 and verdict(rows[later - 1]) == "exact":',
             'while later > 0 and any(verdict(r) == "exact" for r in rows[:later]):',
             (T + "test_audit.py::test_the_first_release_exact_is_the_oldest_after_which_every_release_is_exact",)),
    Breakage("audit crash cell: resumed from the cut's checkpoint by name, not by the framework's auto-resume",
             AUDIT + "audit.py", "command", "return (*auto_resume(framework, argv), None)", "return argv, resume, None",
             (CRASH_CELL,)),
    Breakage("audit crash cell: Lightning's ckpt_path='last' without save_last", AUDIT + "audit.py", "auto_resume",
             '([*argv, "--save_last"], "--ckpt_path last")', '(argv, "--ckpt_path last")', (CRASH_CELL,)),
    Breakage("audit crash cell: counted among the bit-exact cells", AUDIT + "audit.py", "summary_table",
             'rows = [r for r in rows if not r.get("crash")]', "pass", (CRASH_CELL,)),
    Breakage("audit: a failed resume's cell not called failed (its type lost on the way to the row)",
             AUDIT + "audit.py", "verdict", 'return "failed" if row.get("failed") else "unknown"', 'return "unknown"',
             (REFUSED,)),
    Breakage("audit: a straight run that fails taken for the cell's result outside a release",
             "workflow/scripts/audit_cell.py", "main", "        if not release:\n", "        if False:\n", (REFUSED,)),
    Breakage("audit: certify's control piece declared again in the audit", AUDIT + "audit.py", "<module>",
             "from certkit.runs import CONTROL_PIECE\n", 'CONTROL_PIECE = "optimizer"\n', (AUDIT_API,)),
    Breakage("audit: a failure told apart by its message", "workflow/scripts/audit_cell.py", "main",
             "    except CannotJudge as e:\n        raise UserError(f\"{args.framework} {args.scenario}: {e}\") from None\n    write_row",
             '    except CannotJudge as e:\n        str(e).startswith("resume")\n'
             '        raise UserError(f"{args.framework} {args.scenario}: {e}") from None\n    write_row',
             (AUDIT_API,)),
    Breakage("audit releases: versions ordered as text", AUDIT + "audit.py", "release_order",
             'return (Version(row["version"]), *(Version(v) for v in row["with"].split()[1::2]))',
             'return (row["version"], row["with"])',
             (T + "test_audit.py::test_the_first_release_exact_is_the_oldest_after_which_every_release_is_exact",)),
    Breakage("certify: max |Δw| of the final parameters always 0", C + "verdict.py", "final_gap",
             "float((s.double() - t.double()).abs().max())", "0.0",
             (T + "test_certify.py::test_an_emptied_optimizer_state_is_named_optimizer_state_and_so_is_certifys_own_control",)),
    Breakage("certify: the rank named by its number, not by its earliest piece", C + "verdict.py",
             "differences", "rank = min(found, key=lambda r: (ORDER.index(found[r][0]), r))", "rank = min(found)",
             (T + "test_certify.py::test_ddp_under_torchrun_that_forgets_rank_1s_rng_is_named_rank_1_rng_and_the_repair_confirms_it",)),
    Breakage("certify: an RNG nobody seeds compared as if seeded", C + "verdict.py", "unseeded_rngs",
             'if 1 in stopped.get(r, {}) and straight[r][1].get(p) != stopped[r][1].get(p)})',
             'if False})', (T + "test_certify.py::test_an_emptied_optimizer_state_is_named_optimizer_state_and_so_is_certifys_own_control",)),
    Breakage("certify: the resumed runs run COMMAND, not --resume-command", C + "runs.py", "certify",
             "resuming = (resume_command or command) + shlex.split(resume)", "resuming = command + shlex.split(resume)",
             (T + "test_certify.py::test_a_torchrun_command_resumed_on_one_process_by_resume_command_is_judged_on_rank_0",)),
    Breakage("certify: resumed on fewer ranks, each process's samples and RNG compared", C + "verdict.py", "judge",
             "unseeded = sorted(set(unseeded) | set(PER_PROCESS), key=PIECES.index)", "pass",
             (T + "test_certify.py::test_a_resume_on_fewer_ranks_is_judged_on_the_ranks_both_have_in_what_the_update"
                  "_computes_from",)),
    Breakage("certify: a rank lost without --resume-command forgiven", C + "verdict.py", "judge",
             "rescaled = other_world and set(resumed) != set(straight)", "rescaled = set(resumed) != set(straight)",
             (T + "test_certify.py::test_a_resume_on_fewer_ranks_is_judged_on_the_ranks_both_have_in_what_the_update"
                  "_computes_from",)),
    Breakage("certify: a digest that sums words, blind to their order", C + "digest.py", "words_digest",
             "int(np.dot(chunk, _KEYS[:chunk.size]))", "int(chunk.sum())",
             (T + "test_certify.py::test_a_digest_sees_one_changed_byte_two_swapped_words_and_nothing_else",)),
    Breakage("certify: the torch finder gives up at the first lookup (transformers' find_spec probe)",
             C + "site/sitecustomize.py", "_AfterTorch.find_spec",
             "        self.looking = True  # the lookup below", "        sys.meta_path.remove(self)\n        self.looking = True  #",
             (T + "test_certify.py::test_a_process_that_looks_torch_up_before_importing_it_is_recorded",)),
    Breakage("certify: a meta tensor taken for data (a FLOP counter's forward counted as samples)", C + "digest.py",
             "readable", 'if t.device.type == "meta":\n        return False', 'if False:\n        return False',
             (T + "test_certify.py::test_a_forward_on_the_meta_device_runs_to_its_end_unrecorded_and_the_resume_is_exact",)),
    Breakage("certify: a forward hook called without kwargs (a forward that raised) leaks the nesting depth",
             C + "recorder.py", "Recorder._leave",
             "kwargs = kwargs_and_output[0] if len(kwargs_and_output) == 2 else {}", "kwargs, _ = kwargs_and_output",
             (T + "test_certify_others.py::test_activation_checkpointing_leaves_every_later_steps_samples_recorded",)),
    Breakage("certify: the parameters a step starts from not recorded", C + "recorder.py", "Recorder._take_row",
             '"params_in": digest.of_tensors(params), ', "",
             (T + "test_certify.py::test_weights_restored_from_fp16_are_named_the_parameters_the_step_starts_from",)),
    Breakage("certify: the resumed run assumed to start from K (no real-start detection)", C + "verdict.py",
             "real_start", "return min(matches, key=lambda j: (abs(j - offset), j)) if matches else offset",
             "return offset",
             (T + "test_certify.py::test_an_auto_resume_from_a_checkpoint_older_than_k_names_its_real_start_and_the"
                  "_steps_redone",)),
    Breakage("certify: a step where only an unused RNG draw differs called not exact", C + "verdict.py",
             "first_difference", "if computed(found)), None)", "if True), None)",
             (T + "test_certify.py::test_an_rng_draw_nothing_uses_is_a_warning_not_a_difference_and_the_control_"
                  "beside_it_is_caught",)),
    Breakage("certify --control: caught only where the optimizer is the first difference", C + "runs.py", "controlled",
             "caught = any(rows.get(r, {}).get(step, {}).get(CONTROL_PIECE) != straight[r][step][CONTROL_PIECE]",
             'caught = first is not None and (first["step"], first["piece"]) == (step, "optimizer") or any(False',
             (T + "test_certify.py::test_an_rng_draw_nothing_uses_is_a_warning_not_a_difference_and_the_control_"
                  "beside_it_is_caught",)),
    Breakage("certify: the recorder in the user's process imports the orchestration (saves, runs) again",
             C + "recorder.py", "Recorder.install", "                from . import fileevents\n",
             "                from . import fileevents, saves  # noqa: F401\n",
             (T + "test_architecture.py::test_what_certify_loads_into_the_users_process_imports_nothing_of_the"
                  "_orchestration_and_no_cycle",)),
    # certify's diagnosis: one breakage per cause class, each caught by the program that carries that bug
    Breakage("diagnosis: a change to the live weights between steps not seen", C + "diagnosis.py",
             "Found.changed_outside", 'for name, rows, steps in (("straight", self.s, range(1, self.step)),',
             'for name, rows, steps in (("straight", self.s, range(0)),', (DIAGNOSIS + "[inplace_merge_save.py]",)),
    Breakage("diagnosis: fp16-rounded weights compared with the unrounded ones", C + "diagnosis.py",
             "Found.lossy_weights",
             "if digested == self.r[self.step][\"params_in\"]:", "if digested == self.s[self.k][\"params\"]:",
             (DIAGNOSIS + "[half_save.py]",)),
    Breakage("diagnosis: an optimizer restored from another step not matched", C + "diagnosis.py", "Found.optimizer",
             'if self.s[j].get("optimizer") == start["optimizer_in"]), None)', "if False), None)",
             (DIAGNOSIS + "[earlier_step.py]",)),
    Breakage("diagnosis: an RNG back at its seeding called restored from another step", C + "diagnosis.py",
             "Found.rngs", "            if j == 0:", "            if j == -1:", (DIAGNOSIS + "[reseed_randint.py]",)),
    Breakage("diagnosis: the first draw aligned from the resumed run's start (its model init)", C + "diagnosis.py",
             "Found.first_draw", "zip(draws[0][-n:], draws[1][-n:])", "zip(draws[0][:n], draws[1][:n])",
             (DIAGNOSIS + "[reseed_randint.py]",)),
    Breakage("diagnosis: replayed batches not matched to the straight run's step", C + "diagnosis.py", "Found.data",
             'm = min((m for m in self.s if m != self.step and self.s[m].get("samples") == samples),',
             'm = min((m for m in self.s if m == self.step and self.s[m].get("samples") == samples),',
             (DIAGNOSIS + "[sampler_generator.py]",)),
    Breakage("diagnosis: a batch's rows compared in order, a reshuffle not seen", C + "diagnosis.py", "Found.data",
             "if all(sorted(map(row_bytes, a)) == sorted(map(row_bytes, b))",
             "if all(list(map(row_bytes, a)) == list(map(row_bytes, b))",
             (T + "test_diagnosis.py::test_the_same_samples_in_another_order_and_samples_skipped_ahead_are_told_apart",)),
    Breakage("diagnosis: a random transform's elements not compared", C + "diagnosis.py", "Found.data",
             "if 0 < changed <= total // 2:", "if 0 < changed < 0:", (DIAGNOSIS + "[random_getitem.py]",)),
    Breakage("diagnosis: an empty optimizer state at the resume not seen", C + "diagnosis.py", "Found.optimizer",
             '        if start.get("optimizer_in_empty"):', "        if False:",
             (T + "test_certify.py::test_an_emptied_optimizer_state_is_named_optimizer_state_and_so_is_certifys_own"
                  "_control",)),
    Breakage("diagnosis: a restarted scheduler not recognised", C + "diagnosis.py", "Found.lr",
             'n = common_prefix(ours, [self.s[t]["lr"] for t in sorted(self.s)])', "n = 0",
             (DIAGNOSIS + "[scheduler_restart.py]",)),
    Breakage("diagnosis: a cause guessed where none matched (the first piece's class)", C + "diagnosis.py", "diagnose",
             'causes = found.causes or [cause("unknown",', 'causes = found.causes or [cause("optimizer_not_restored",',
             (T + "test_diagnosis.py::test_a_fault_outside_the_classes_is_unknown_with_what_was_compared_and_ci_shows"
                  "_the_why",)),
    Breakage("certify: runs that share a folder not refused", C + "runs.py", "Runs.run",
             "            self.refuse_shared(name)", "            pass",
             (T + "test_certify.py::test_runs_that_share_a_checkpoint_folder_are_refused_naming_the_file",)),
    Breakage("certify --straight-from: another command's straight run reused", C + "runs.py", "Runs.reuse_straight",
             "        if command != argv:", "        if False:", REUSED),
    Breakage("certify --straight-from: a straight run that kept less state reused", C + "runs.py",
             "Runs.reuse_straight", "if kept.get(k) != str(v)), None)", "if False), None)", REUSED),
    Breakage("certify --straight-from: a straight run changed since certify wrote it reused", C + "runs.py",
             "Runs.reuse_straight", 'and listed.get(n, "absent") != now[n]), None)', "and False), None)", REUSED),
    Breakage("certify --junit: one certify run's suite replaces the other runs' in the file", C + "reports.py",
             "write_junit", "    if path.exists():", "    if False:",
             (CI + "test_junit_has_a_suite_per_run_a_case_per_rank_and_the_failure_names_step_rank_and_piece",)),
    Breakage("certify_resume: a resume that is not exact passes the project's test", C + "pytest_plugin.py",
             "certify_resume", "        if proc.returncode == 0:", "        if proc.returncode in (0, 1):",
             (CI + "test_the_pytest_fixture_passes_an_exact_resume_and_fails_a_forgetful_one_with_the_verdict",)),
    Breakage("certify --crash: a resume from an older checkpoint than the newest complete one called exact",
             C + "saves.py", "classify", "    if start < newest:", "    if False:",
             (CRASH + "test_a_resume_from_an_older_checkpoint_than_the_newest_complete_one_is_lost_work_of_two_steps",)),
    Breakage("certify --crash: a rerun into the same --out keeps the earlier run's recorded saves", C + "outdir.py",
             "<module>", '"parting.svg", "saves", "crash",', '"parting.svg", "crash",',
             (CRASH + "test_a_torn_overwrite_of_the_only_checkpoint_is_a_hard_fail",)),
    Breakage("certify --crash: the power-loss states skipped", C + "saves.py", "crash_points",
             "    if MODELS[1] in models:", "    if False:",
             (CRASH + "test_a_rename_without_fsync_survives_every_kill_but_not_a_power_loss",)),
    Breakage("certify --crash: crash.svg paints each point in the colour of the outcome before its own",
             C + "saves.py", "picture", 'fill="{COLOURS[p["outcome"]]}"',
             'fill="{list(COLOURS.values())[list(COLOURS).index(p["outcome"]) - 1]}"',
             (CRASH + "test_a_rename_without_fsync_survives_every_kill_but_not_a_power_loss",)),
    Breakage("certify --crash --jobs: a run's end kills the runs beside it too", C + "runs.py", "execute",
             "if beside and \"CERTIFY_RECORD\" in env else None", "if False else None",
             (CRASH + "test_a_rename_without_fsync_survives_every_kill_but_not_a_power_loss",)),
    Breakage("certify lanes: a not-exact verdict judged through whatever the runs reached when ended",
             C + "runs.py", "certify",
             "ended = lanes.early_end(straight, stopped, killed, resumed, start, kill_at, stop_after, out) if early else None",
             "ended = None", (T + "test_certify.py::test_verdicts_are_the_same_field_for_field_in_one_lane_or_two",)),
    Breakage("certify lanes: a copy of the stopped run's checkpoint taken for the straight run's (its mtime kept)",
             C + "runs.py", "Runs.refuse_shared", "| folders", "",
             (T + "test_certify.py::test_a_plain_loop_that_forgets_its_generator_is_named_samples_at_the_first_resumed_step",)),
    Breakage("certify diagnosis: an RNG drawn ahead of every checkpoint called restored from another step",
             C + "diagnosis.py", "Found.rngs", "elif j > self.held():", "elif False:",
             (T + "test_diagnosis.py::test_an_rng_ahead_of_every_checkpoint_is_drawn_ahead_not_restored_from_another_step",)),
    Breakage("certify lanes: the runs ended at the first difference with the cause not yet shown", C + "lanes.py",
             "early_end", 'return parted if why and any(c["class"] != "unknown" for c in why["causes"]) else None',
             "return parted", (T + "test_certify.py::test_the_runs_end_early_only_once_the_steps_so_far_name_a_cause",)),
    Breakage("certify lanes: a certificate's line still being written taken for a row", C + "progress.py",
             "new_rows", 'whole = data[:data.rfind(b"\\n") + 1]', "whole = data",
             (T + "test_certify.py::test_a_certificate_read_as_it_is_written_takes_whole_lines_once",)),
    Breakage("certify lanes: the runs not ended at the first difference", C + "lanes.py", "Stream.look",
             "        self.stop.set()\n", "",
             (T + "test_certify.py::test_the_stream_says_the_first_difference_and_ends_the_runs_once_its_cause_is_known",
              T + "test_certify.py::test_runs_ended_at_the_first_difference_leave_no_process_and_name_what_a_full_run_names")),
    Breakage("certify lanes: two lanes where a run takes every CPU", C + "lanes.py", "default_jobs",
             "lanes = max(1, min(2, cpus // threads))", "lanes = 2",
             (T + "test_certify.py::test_the_default_lanes_follow_the_cpus_the_threads_a_gpu_and_launchers",)),
    Breakage("certify --crash: --max-points not shared between the failure models",
             C + "saves.py", "sampled", "taken = spread(states, left // (len(groups) - i))",
             "taken = spread(states, left)",
             (CRASH + "test_max_points_are_shared_between_the_failure_models_and_spread_within_each",)),
    Breakage("export: wrong RMSNorm eps", M + "export.py", "hf_config", '"rms_norm_eps": cfg.rms_norm_eps,',
             '"rms_norm_eps": 1e-6,',
             (T + "test_inference_export.py::test_transformers_logits_match_mmkit_on_same_fp16_weights",)),
    Breakage("export: untied head let through", M + "export.py", "inference_tensors",
             "raise UserError(\"lm_head.weight differs", "return None or UserError(\"lm_head.weight differs",
             (T + "test_inference_export.py::test_export_refuses_weights_whose_head_is_not_tied",)),
]


def function_span(text: str, function: str, file: str) -> tuple[int, int]:
    """Character offsets of FUNCTION's source in TEXT (its def line to its last line, whole lines)."""
    if function == "<module>":
        return 0, len(text)
    nodes, node = ast.parse(text).body, None
    for part in function.split("."):
        node = next((n for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            raise SystemExit(f"mutants: {file} has no function {function}")
        nodes = node.body
    starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"] + [len(text)]  # of each line, as ast counts
    return starts[node.lineno - 1], starts[min(node.end_lineno, len(starts) - 1)]


def broken(b: Breakage, text: str) -> str:
    """TEXT with B's snippet replaced, inside B's function, where it must occur exactly once."""
    start, end = function_span(text, b.function, b.file)
    found = text[start:end].count(b.old)
    if found != 1:
        raise SystemExit(f"mutants: '{b.name}': the snippet occurs {found} times in {b.function} of {b.file}")
    return text[:start] + text[start:end].replace(b.old, b.new) + text[end:]


def tracked_copy(dest: Path) -> Path:
    for f in tracked_files():
        if (REPO / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, dest / f)
    return dest


def build_shared_pipeline(dest: Path) -> Path:
    import yaml
    from conftest import TINY, copy_workflow, snakemake

    work = copy_workflow(dest)
    (work / "tiny.yaml").write_text(yaml.safe_dump({**TINY, "outdir": "results"}))
    snakemake(work)
    return work


def run_tests(work: Path, root: Path, tests, shared: Path, *options, rebuild=(), stop=False) -> tuple[list, str]:
    """Run TESTS in WORK under the outcomes plugin: (its records, the last line pytest printed)."""
    outcomes = root / "outcomes.jsonl"
    outcomes.unlink(missing_ok=True)
    # the lab's and certify's packages from WORK, before the editable installs of the unbroken ones
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", OUTCOMES: str(outcomes), "MMKIT_SHARED_PIPELINE": str(shared),
           "PYTHONPATH": os.pathsep.join([str(work / "src"), str(work / "tests"), str(work / "certify" / "src")])}
    for name in ("MMKIT_SHARED_PIPELINE_UPDATE", "CI", STOP, RECORD):
        env.pop(name, None)  # CI: under CI=true a skipped test fails, and a skip must not count as a catch
    if rebuild:
        env["MMKIT_SHARED_PIPELINE_UPDATE"] = " ".join(rebuild)
    if stop:
        env[STOP] = "1"
    args = ["-q", "-p", "no:cacheprovider", "-p", "outcomes", "--rootdir", str(work), "--basetemp", str(root / "tmp"),
            *options, *tests]
    code, said = pytest_process(work, env, args, root / "pytest.log")
    records = [json.loads(line) for line in outcomes.read_text().splitlines()] if outcomes.exists() else []
    return records, (said.strip().splitlines() or [f"exit {code}"])[-1]


# A breakage's tests run in a pytest process of their own, forked from a server that has imported what every
# such process imports first (torch alone is 2 s of CPU), and nothing of the code under test: mmkit, certkit,
# the tests and their plugins are imported by the child, from the broken copy. MMKIT_MUTANTS_FORK=0: a fresh
# `python -m pytest` each time instead.
# torch._dynamo: imported by a process's first optimizer call (tests/launch.py: PRELOAD); hypothesis and DCP:
# imported by the test files that most breakages run (in all, 2.6 s of CPU a breakage, measured with -X importtime)
ZYGOTE_PRELOAD = ["torch", "numpy", "yaml", "jsonschema", "filelock", "pytest", "torch._dynamo",
                  "torch.distributed.checkpoint", "hypothesis"]
_zygote = []


def pytest_process(work: Path, env: dict, args: list, log: Path) -> tuple[int, str]:
    """(exit status, stdout and stderr) of `python -m pytest ARGS` in WORK with ENV."""
    if os.environ.get("MMKIT_MUTANTS_FORK", "1") == "0":
        proc = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=work, env=env, capture_output=True,
                              text=True)
        return proc.returncode, proc.stdout
    if not _zygote:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(ZYGOTE_PRELOAD)
        _zygote.append(context)
    child = _zygote[0].Process(target=pytest_child, args=(str(work), env, args, str(log)))
    child.start()
    child.join()
    return child.exitcode, log.read_text(errors="replace") if log.exists() else ""


def pytest_child(work: str, env: dict, args: list, log: str) -> None:
    """In the forked process: become `python -m pytest ARGS` in WORK with ENV (PYTHONPATH and
    PYTHONDONTWRITEBYTECODE as the interpreter would read them at its start), output to LOG."""
    os.chdir(work)
    os.environ.clear()
    os.environ.update(env)
    sys.path[:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    for fd, path, mode in ((0, os.devnull, os.O_RDONLY), (1, log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        opened = os.open(path, mode, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    os.dup2(1, 2)
    sys.argv = ["pytest", *args]
    # __main__ as `python -m pytest` has it (what a multiprocessing start in a test imports as its main), not
    # this file, which the fork server's child imported to find this function
    main = types.ModuleType("__main__")
    main.__spec__ = importlib.util.find_spec("pytest.__main__")
    sys.modules["__main__"] = main
    unbroken = tuple(str(REPO / d) + os.sep for d in ("tests", "certify", "workflow", "src"))
    for name, module in list(sys.modules.items()):  # this file's imports from the unbroken tree (outcomes):
        if str(getattr(module, "__file__", None) or "").startswith(unbroken):  # the child imports WORK's
            del sys.modules[name]
    import pytest

    sys.exit(int(pytest.main(args)))


def of(tests, records) -> list:
    """The records of the tests that TESTS names (a file, a test, or one parametrization of it)."""
    return [r for r in records if any(r["test"] == t or r["test"].startswith((t + "::", t + "[")) for t in tests)]


def recorded_test_run():
    """(outcomes, pipeline) of the make test run recorded in TEST_RECORD, if it ran exactly this tree and
    built its pipeline; else None."""
    try:
        same = (TEST_RECORD / "tree.sha256").read_text().strip() == tree_digest()
        pipeline = Path((TEST_RECORD / "pipeline").read_text().strip())
        records = [json.loads(line) for line in (TEST_RECORD / "outcomes.jsonl").read_text().splitlines()]
    except (OSError, ValueError):
        return None
    return (records, pipeline) if same and (pipeline.parent / "pipeline.built").exists() else None


def baseline(chosen, tmp: Path, shared: Path, runs: int, recorded=None) -> dict:
    """{tests: what is wrong with them on the unbroken code} for every distinct test set of CHOSEN that does
    not pass RUNS times over: a failure, an error, a skip, or no test at all. RECORDED: the outcomes of a
    make test run of this very tree, taken as the first run."""
    sets = list(dict.fromkeys(b.tests for b in chosen))
    ids = list(dict.fromkeys(t for tests in sets for t in tests))
    work = tracked_copy(tmp / "baseline" / "code")
    wrong = {}
    for run in range(runs):
        if run == 0 and recorded is not None:
            records = recorded
            print(f"baseline 1 of {runs}: {len(ids)} test ids, from make test's run of this tree "
                  f"({TEST_RECORD.name}/)", flush=True)
        else:
            records, last = run_tests(work, tmp / "baseline", ids, shared, "-n", "2", "--dist", "loadfile")
            print(f"baseline {run + 1} of {runs}: {len(ids)} test ids on the unbroken code [{last}]", flush=True)
        for tests in sets:
            mine = of(tests, records)
            bad = [r for r in mine if r["outcome"] != "passed"]
            if bad:
                r = bad[0]
                wrong.setdefault(tests, f"run {run + 1}: {r['test']} {r['outcome']} in {r['when']} "
                                        f"({r['exception']} at {r['at']}: {r['message']})")
            elif not [r for r in mine if r["when"] == "call"]:
                wrong.setdefault(tests, f"run {run + 1}: no test ran")
    return wrong


def how(records) -> str:
    """What the records say, in a line: the catching assertion, else what did happen."""
    caught = [r for r in records if r["assertion"]]
    if caught:
        r = caught[0]
        return f"{r['test']}: {r['exception']} at {r['at']}"
    failed = [r for r in records if r["outcome"] != "passed"]
    if not failed:
        return "every test passed" if records else "no test ran"
    r = failed[0]
    where = "setup error" if r["when"] == "setup" else f"{r['when']}: {r['outcome']}"
    return f"only {where} in {r['test']} ({r['exception']} at {r['at']}: {r['message']})"


def run_breakage(b: Breakage, root: Path, shared: Path, passed: set) -> tuple[bool, float, str, str]:
    """B tried: its named tests first, the cheapest that catch it; only if they all pass, the whole files they
    are in, where a catch counts only from a test that PASSED on the unbroken code (make test's record)."""
    work = tracked_copy(root / "code")
    target = work / b.file
    target.write_text(broken(b, target.read_text()))
    t0 = time.perf_counter()
    records, last = run_tests(work, root, b.tests, shared, rebuild=b.rebuild, stop=True)
    caught, said = any(r["assertion"] for r in records), how(records)
    files = list(dict.fromkeys(t.split("::")[0] for t in b.tests))
    if not caught and records and all(r["outcome"] == "passed" for r in records) and files != list(b.tests):
        records, last = run_tests(work, root, files, shared, rebuild=b.rebuild, stop=True)
        records = [r for r in records if r["test"] in passed]
        caught, said = any(r["assertion"] for r in records), f"{how(records)} (its files: the named tests passed)"
    return caught, time.perf_counter() - t0, said, last


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-k", default="", help="only breakages whose name matches this regular expression")
    p.add_argument("-j", type=int, default=3, help="breakages tried at once (each in its own folder)")
    p.add_argument("--list", action="store_true", help="print the chosen breakages and exit")
    p.add_argument("--baseline-runs", type=int, default=1, help="times the tests run on the unbroken code first")
    p.add_argument("--fresh", action="store_true", help="build the pipeline and run the baseline here, even if "
                   "make test recorded a run of this tree")
    args = p.parse_args()
    chosen = [b for b in BREAKAGES if re.search(args.k, b.name)]
    for b in chosen:  # a stale table fails here, before anything is built
        broken(b, (REPO / b.file).read_text())
    if args.list:
        for b in chosen:
            print(f"{b.name}\n    {b.file}: {b.function}{'  (rebuilt: ' + ', '.join(b.rebuild) + ')' if b.rebuild else ''}\n    "
                  + "\n    ".join(b.tests))
        return
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        tmp = Path(tmp)
        recorded = None if args.fresh else recorded_test_run()
        if recorded:
            shared = recorded[1]
            print(f"the shared tiny pipeline: make test's, built by this tree ({shared})", flush=True)
        else:
            print("building the shared tiny pipeline with the unbroken code ...", flush=True)
            shared = build_shared_pipeline(tmp / "shared")
        wrong = baseline(chosen, tmp, shared, args.baseline_runs, recorded and recorded[0])
        # the tests a fallback to a whole file may count a catch from: those that passed on the unbroken code
        passed = {r["test"] for r in (recorded[0] if recorded else []) if r["outcome"] == "passed"}
        for tests, why in wrong.items():
            print(f"BASELINE FAILS  {', '.join(tests)}: {why}", flush=True)

        def attempt(i, b):
            root = tmp / f"m{i}"
            root.mkdir()
            caught, seconds, caught_how, last = run_breakage(b, root, shared, passed)
            print(f"{'caught' if caught else 'MISSED'}  {seconds:5.1f} s  {b.name}\n        {caught_how}  [{last}]",
                  flush=True)
            shutil.rmtree(root, ignore_errors=True)
            return b, caught, seconds

        todo = [b for b in chosen if b.tests not in wrong]
        todo.sort(key=lambda b: not b.rebuild)  # those that rebuild artifacts (the longest) first
        # much of a breakage's time is one process waiting for another (a start, a hang called after
        # HANG_S, torchrun's teardown): three at a time keep two cores busy
        with ThreadPoolExecutor(args.j) as pool:
            results = list(pool.map(attempt, range(len(todo)), todo))
    caught = sum(c for _, c, _ in results)
    seconds = time.perf_counter() - t_all
    print(f"\nscore: {caught} of {len(chosen)} breakages caught on an assertion, in {seconds:.0f} s")
    print("slowest: " + "; ".join(f"{b.name} {s:.0f} s" for b, _, s in sorted(results, key=lambda r: -r[2])[:3]))
    for b, c, _ in results:
        if not c:
            print(f"missed: {b.name} ({b.file}: {b.function}; tests {', '.join(b.tests)})")
    for b in chosen:
        if b.tests in wrong:
            print(f"not tried, its tests fail on the unbroken code: {b.name}")
    sys.exit(0 if caught == len(chosen) else 1)


if __name__ == "__main__":
    main()
