"""Resume equality well beyond one cut: at every step, and across a chain of resumes."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import TINY, assert_same_state_dict, run_script


def train(tiny_run, out, *args):
    proc = run_script("run.py", "--config", tiny_run["config"], "--tokens", tiny_run["tokens"], "--out", out, *args)
    assert proc.returncode == 0, proc.stderr
    return out


def assert_same_bits(a, b):
    a, b = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    assert_same_state_dict(a, b)


def stop_and_resume(tiny_run, tmp_path, k):
    resume = train(tiny_run, tmp_path / f"resume{k}.pth", "--stop-at", k)
    return train(tiny_run, tmp_path / f"resumed{k}.pth", "--resume", resume, "--loss-log", tmp_path / f"log{k}.csv")


def test_resuming_at_every_step_gives_the_straight_weights(pipeline, tiny_run, tmp_path):
    cuts = range(1, TINY["steps"])
    with ThreadPoolExecutor(2) as pool:  # two processes at a time, one per core
        outs = list(pool.map(lambda k: stop_and_resume(tiny_run, tmp_path, k), cuts))
    straight_log = (pipeline / "straight_log.csv").read_text().splitlines()
    for k, out in zip(cuts, outs):
        assert_same_bits(pipeline / "straight.pth", out)
        assert (tmp_path / f"log{k}.csv").read_text().splitlines()[1:] == straight_log[1 + k:]


def test_a_chain_of_resumes_gives_the_straight_weights(pipeline, tiny_run, tmp_path):
    # stop at 3, resume and stop at 6, resume and stop at 9, resume to the end (the task's 15/30/45/60, scaled)
    resume = train(tiny_run, tmp_path / "r3.pth", "--stop-at", 3)
    for stop in (6, 9):
        resume = train(tiny_run, tmp_path / f"r{stop}.pth", "--resume", resume, "--stop-at", stop)
    final = train(tiny_run, tmp_path / "final.pth", "--resume", resume)
    assert_same_bits(pipeline / "straight.pth", final)


def test_a_chain_ends_in_the_same_resume_file_as_one_stop(pipeline, tiny_run, tmp_path):
    chained = train(tiny_run, tmp_path / "r9.pth", "--resume",
                    train(tiny_run, tmp_path / "r4.pth", "--stop-at", 4), "--stop-at", 9)
    direct = train(tiny_run, tmp_path / "d9.pth", "--stop-at", 9)
    a, b = torch.load(chained, weights_only=True), torch.load(direct, weights_only=True)
    assert a["step"] == b["step"] == 9
    # the run's own record differs by design: the chained run started from r4.pth and logged steps 5..9
    assert a["origin"]["resume_sha256"] is not None and b["origin"]["resume_sha256"] is None
    assert a["loss_log"] == b["loss_log"][4:] and [s for s, _ in a["loss_log"]] == [5, 6, 7, 8, 9]
    run_record = ("origin", "loss_log", "digests")
    # weights, every AdamW tensor, the generator state, the step counts and their digests
    assert_same_state_dict({k: v for k, v in a.items() if k not in run_record},
                           {k: v for k, v in b.items() if k not in run_record})
    assert {k: v for k, v in a["digests"].items() if k not in run_record} == \
        {k: v for k, v in b["digests"].items() if k not in run_record}


@pytest.mark.parametrize("atol, code", [(0.0, 1), (1e9, 0)])
def test_compare_exit_code_follows_atol(pipeline, atol, code):
    proc = run_script("compare.py", pipeline / "straight.pth", pipeline / "noskip.pth", "--atol", atol)
    assert proc.returncode == code, proc.stdout


def test_compare_lists_each_differing_tensor(pipeline):
    proc = run_script("compare.py", pipeline / "straight.pth", pipeline / "noopt.pth")
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("DIFF", "same"))]
    assert len(rows) == len(torch.load(pipeline / "straight.pth", weights_only=True))
    assert any(r.startswith("DIFF") and "embed_tokens" in r for r in rows)


def test_compare_reads_the_weights_of_a_resume_file(pipeline, tiny_run):
    proc = run_script("compare.py", tiny_run["resume"], tiny_run["resume"])
    assert proc.returncode == 0


def test_compare_refuses_bad_input_with_exit_2(pipeline, tmp_path):
    (tmp_path / "x.pth").write_bytes(b"")
    proc = run_script("compare.py", pipeline / "straight.pth", tmp_path / "x.pth")
    assert proc.returncode == 2 and proc.stderr.startswith("error: ")


def test_resume_is_bit_exact_in_bf16_autocast_too(tiny_run, tmp_path):
    import yaml
    from conftest import tiny_config

    config = tmp_path / "bf16.yaml"
    config.write_text(yaml.safe_dump(tiny_config(precision="bf16")))
    bf16_run = {**tiny_run, "config": config}
    straight = train(bf16_run, tmp_path / "straight.pth", "--loss-log", tmp_path / "straight.csv")
    resumed = stop_and_resume(bf16_run, tmp_path, 5)
    assert_same_bits(straight, resumed)
    # autocast really ran: the bf16 losses are not the fp32 ones
    fp32_log = (tiny_run["resume"].parent / "straight_log.csv").read_text()
    assert (tmp_path / "straight.csv").read_text() != fp32_log
    # and the master weights stay fp32
    assert all(t.dtype == torch.float32 for t in torch.load(straight, weights_only=True).values())
