"""certify says why and where: each cause class on an unmodified program written as other people write them
(tests/programs/diagnose/: nanoGPT's reseeded batches, MiniMind's fp16 checkpoint and random transform in
__getitem__, a scheduler built afresh, a sampler's generator never saved, an optimizer saved every third step,
a LoRA merge that writes into the live weights, the trained batches skipped twice), each through certify's
command line in real processes.

The expected cause follows from the bug each program carries, and the expected line is found in the program's
source by the call that makes the bug (the torch.randint, the random.random, the torch.save of half tensors),
never read back from certify's output.
"""

import json
import subprocess
import sys

import pytest
from conftest import REPO, clean_env

CERTIFY = [sys.executable, "-m", "certkit"]
PROGRAMS = REPO / "tests" / "programs" / "diagnose"
ENV = {**clean_env(), "OMP_NUM_THREADS": "1"}


def certify(out, stop_after, command, resume, *options):
    proc = subprocess.run([*CERTIFY, "--out", str(out), "--stop-after", str(stop_after), f"--resume={resume}",
                           *options, "--", *map(str, command)], capture_output=True, text=True, env=ENV, timeout=600)
    verdict = json.loads((out / "verdict.json").read_text()) if (out / "verdict.json").exists() else None
    return proc, verdict


def line_of(program: str, text: str, after: str | None = None) -> str:
    """PROGRAM's file:line of the one line holding TEXT (after the line holding AFTER)."""
    lines = (PROGRAMS / program).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if after in line) if after else 0
    found = [i + 1 for i, line in enumerate(lines) if i >= start and text in line]
    assert found, f"{text!r} not in {program}"
    return f"{PROGRAMS / program}:{found[0]}"


def absolute(where: str) -> str:
    """WHERE ("file:line call") with its file made absolute: certify shows a file under the cwd relative to it."""
    place, call = where.split(" ", 1)
    return f"{(REPO / place).resolve()} {call}"  # the tests run certify from the repository's root


# program: (stop after, the classes in causal order, details each must carry, the call and text of its line)
CASES = {
    "reseed_randint.py": (4, ["rng_reseeded", "data_position"],
                          [{"rng": "torch"}, {"how": "replayed", "from_step": 1}], ("torch.randint", "torch.randint(")),
    "half_save.py": (4, ["lossy_weights"], [{"dtype": "float16"}], ("torch.save", "torch.save(")),
    "random_getitem.py": (4, ["rng_reseeded", "data_position"], [{"rng": "python"}, {"how": "random transform"}],
                          ("random.random", "random.random()")),
    "scheduler_restart.py": (4, ["scheduler_restarted"], [{}], None),
    "sampler_generator.py": (6, ["rng_reseeded", "data_position"], [{"rng": "torch"}, {"how": "replayed", "from_step": 3}],
                             None),
    "earlier_step.py": (4, ["other_step"], [{"piece": "optimizer", "from_step": 3}], None),
    "inplace_merge_save.py": (4, ["changed_outside_step"], [{"run": "straight", "after_step": 2}],
                              ("torch.save", "torch.save(", "w += ")),  # the export's save, after the merge
    # step 5 trains on batch 9 (0-based 8: the Subset starts at batch 4, and 4 more are skipped)
    "double_skip.py": (4, ["data_position"], [{"how": "skipped ahead", "from_step": 9}], None),
}
# the causes only later steps show: the runs go on to the end (the others end once every rank has parted)
TO_THE_END = ("double_skip.py",)


# make test keeps three programs (a reseeded RNG with replayed data, a lossy save, a forgotten sampler
# generator); the others run in the slow tier (the batches skipped twice: test_certify.py's
# test_the_runs_end_early_only_once_the_steps_so_far_name_a_cause is its fast witness)
SLOW_CASES = ("random_getitem.py", "scheduler_restart.py", "earlier_step.py", "inplace_merge_save.py", "double_skip.py")


@pytest.mark.parametrize("program", [pytest.param(p, marks=pytest.mark.slow) if p in SLOW_CASES else p for p in CASES])
def test_each_cause_is_named_with_its_evidence_and_the_users_line(tmp_path, program):
    """Catches: a cause named without its evidence holding or not named where it holds (each program has one
    bug, and certify must name its class: a wrong class, or unknown, fails), the causes out of causal order
    (the reseeded RNG before the batches it drew), a line that is not the user's call that lost the state (the
    first draw aligned from the start of the resumed run, not from step K + 1's end, names the model's init);
    runs ended at the first difference where only later steps show the cause (unknown), or not ended where
    the steps so far show it."""
    stop_after, classes, details, call = CASES[program]
    proc, verdict = certify(tmp_path / "out", stop_after, [sys.executable, PROGRAMS / program, "--out_dir", "{run}"],
                            "--resume {run}/ckpt_{step}.pt")
    assert proc.returncode == 1 and not verdict["exact"], proc.stderr[-3000:]
    assert (verdict["ended_early"] is None) == (program in TO_THE_END), verdict["ended_early"]
    diagnosis = verdict["diagnosis"]
    assert (diagnosis["step"], diagnosis["rank"]) == (stop_after + 1, 0), diagnosis
    assert [c["class"] for c in diagnosis["causes"]] == classes, diagnosis
    for found, expected in zip(diagnosis["causes"], details):
        assert {k: found.get(k) for k in expected} == expected, found
        assert found["evidence"] and found["fix"], found
    if call is not None:
        name, *text = call
        assert absolute(diagnosis["causes"][0]["where"]) == f"{line_of(program, *text)} {name}", diagnosis["causes"][0]
    else:
        assert all(c["where"] is None for c in diagnosis["causes"]), diagnosis
    said = (tmp_path / "out" / "verdict.md").read_text()
    assert f"## Why (step {stop_after + 1}, rank 0)" in said and diagnosis["causes"][0]["title"] in said
    assert proc.stdout.splitlines()[-1].startswith("why: " + diagnosis["causes"][0]["title"])


def test_a_fault_outside_the_classes_is_unknown_with_what_was_compared_and_ci_shows_the_why(tmp_path):
    """Catches: a guess (a class named without its evidence) where nothing known matches: this program doubles
    its loss after a resume, so only the gradients and what follows differ; and a diagnosis missing from the
    JUnit failure message or the step summary."""
    program = tmp_path / "double_loss.py"
    program.write_text(
        "import os, sys, torch\n"
        "torch.manual_seed(0)\n"
        "net = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "x = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))\n"
        "out, step, scale = sys.argv[1], 0, 1.0\n"
        "os.makedirs(out, exist_ok=True)\n"
        "if '--resume' in sys.argv:\n"
        "    state = torch.load(sys.argv[-1], weights_only=True)\n"
        "    net.load_state_dict(state['net']); opt.load_state_dict(state['opt']); step, scale = state['step'], 2.0\n"
        "while step < 8:\n"
        "    loss = scale * net(x[step * 4:(step + 1) * 4]).pow(2).mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step(); step += 1\n"
        "    torch.save({'net': net.state_dict(), 'opt': opt.state_dict(), 'step': step}, f'{out}/ckpt_{step}.pt')\n")
    junit, summary = tmp_path / "junit.xml", tmp_path / "summary.md"
    proc, verdict = certify(tmp_path / "out", 4, [sys.executable, program, "{run}"], "--resume {run}/ckpt_{step}.pt",
                            "--junit", junit, "--summary", summary)
    assert proc.returncode == 1 and verdict["first"]["piece"] == "gradients", proc.stderr[-3000:]
    [only] = verdict["diagnosis"]["causes"]
    assert only["class"] == "unknown" and only["where"] is None and only["fix"] is None
    assert "the resumed run's samples" not in only["evidence"]  # samples are equal: not compared as a cause
    assert "each run's parameters after a step" in only["evidence"]
    assert "why: Unknown" in junit.read_text() and "#### Why (step 5, rank 0)" in summary.read_text()


@pytest.mark.quick
def test_the_same_samples_in_another_order_and_samples_skipped_ahead_are_told_apart(tmp_path):
    """Catches: a batch of the straight run's samples, shuffled, called a random transform or left unknown (the
    rows compared as a multiset), and batches taken from a later step called replayed. In-process, on rows and
    kept inputs made here: no program of tests/programs/diagnose/ reshuffles within a batch."""
    import torch
    from certkit import diagnosis

    batch = torch.arange(24).reshape(6, 4)
    for name, inputs in (("straight", batch), ("resumed", batch[[2, 0, 1, 5, 4, 3]])):
        (tmp_path / name).mkdir()
        torch.save([[inputs]], tmp_path / name / "rank0.inputs_at.pt")
    straight = {0: {s: {"samples": f"s{s}", "lr": [0.1]} for s in range(1, 9)}}
    shuffled = {0: {s: {"samples": f"r{s}", "lr": [0.1]} for s in range(5, 9)}}
    v = {"exact": False, "stop_after": 4, "resumed_from": 4, "not_compared": [],
         "first": {"step": 5, "rank": 0, "piece": "samples", "pieces": {0: ["samples"]}}}
    [order] = diagnosis.diagnose(v, straight, shuffled, tmp_path)["causes"]
    assert (order["class"], order.get("how")) == ("data_position", "another order"), order
    ahead = {0: {s: {"samples": f"s{s + 2}", "lr": [0.1]} for s in range(5, 7)}}
    [skipped] = diagnosis.diagnose(v, straight, ahead, tmp_path)["causes"]
    assert (skipped.get("how"), skipped.get("from_step")) == ("skipped ahead", 7), skipped
    assert "samples at steps 5..6 are the straight run's of steps 7..8" in skipped["evidence"]


@pytest.mark.quick
def test_an_rng_ahead_of_every_checkpoint_is_drawn_ahead_not_restored_from_another_step(tmp_path):
    """Catches: an RNG state the resumed run reached by drawing (a loader skipping batches by iterating them:
    Accelerate's cells in the audit) called restored from a step no checkpoint held; and a state a checkpoint
    did hold (the stopped run got that far: --lose) no longer called restored from that step. In-process."""
    from certkit import diagnosis

    straight = {0: {s: {"samples": f"s{s}", "rng_torch": f"g{s}", "lr": [0.1]} for s in range(1, 13)}}
    resumed = {0: {s: {"samples": f"s{s}", "rng_torch": f"g{s + 5}", "lr": [0.1]} for s in range(5, 13)}}
    for last, expected in ((4, ("rng_drawn_ahead", None)), (9, ("other_step", 9))):
        v = {"exact": False, "stop_after": 4, "resumed_from": 4, "not_compared": [],
             "steps": {"stopped": {0: (1, last)}},
             "first": {"step": 5, "rank": 0, "piece": "rng_torch", "pieces": {0: ["rng_torch"]}}}
        [found] = diagnosis.diagnose(v, straight, resumed, tmp_path)["causes"]
        # the state at step 5 is the straight run's at step 10: the one after step 9's update
        assert (found["class"], found.get("from_step")) == expected, found
        if expected[0] == "rng_drawn_ahead":
            assert found["as_of_step"] == 10 and "last step was 4" in found["evidence"], found
