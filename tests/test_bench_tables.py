"""The targets table in docs/speed.md is the latest benchmark's, every figure recomputed here from bench/results.csv.

The benchmark itself takes half an hour and is not run by the tests; its tables are, from its CSV.
"""

import csv
import re
import subprocess
import sys

import pytest
from conftest import REPO

BENCH = REPO / "bench"


def csv_rows() -> list[dict]:
    with open(BENCH / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def one(rows, **match) -> dict:
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    assert len(found) == 1, match
    return found[0]


def targets_rows() -> dict:
    """{target: (limit, measured, met)} as bench/targets.md prints them."""
    rows = {}
    for line in (BENCH / "targets.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 5 and cells[0] not in ("target", "---"):
            rows[cells[0]] = tuple(cells[1:4])
    return rows


def test_the_speed_doc_shows_the_targets_table_the_csv_gives(tmp_path):
    # catches: a docs/speed.md block typed or left from an older run; targets.md edited by hand
    out = tmp_path / "targets.md"
    subprocess.run([sys.executable, str(BENCH / "bench.py"), "--from-csv", str(BENCH / "results.csv"),
                    "--out-csv", str(tmp_path / "unused.csv"), "--out-md", str(tmp_path / "unused.md"),
                    "--out-targets", str(out)], check=True, capture_output=True)
    assert out.read_text() == (BENCH / "targets.md").read_text()
    speed = (REPO / "docs" / "speed.md").read_text()
    block = re.search(r"<!-- bench:start -->\n(.*?)<!-- bench:end -->", speed, re.S)
    assert block and block[1] == out.read_text()


@pytest.mark.quick
def test_every_target_figure_is_recomputed_from_the_csv():
    # catches: a ratio taken from the wrong row (dims, threads, precision), the matmul share computed against
    # another dtype's rate, MiB shown as GB, a 'met' that ignores the limit's direction
    rows, targets = csv_rows(), targets_rows()
    machine = one(rows, section="machine")["what"]
    assert re.search(r"ISA flags: (\w+: )?amx_bf16 (yes|no), avx512_bf16 (yes|no), avx512f (yes|no)", machine)
    assert (BENCH / "targets.md").read_text().startswith(f"Machine: {machine}.")
    step = {p: one(rows, section="step", what="ours", dims="minimind2-small", precision=p, threads="1")
            for p in ("fp32", "bf16")}
    rate = {p: float(one(rows, section="matmul", precision=p, threads="1")["gflops"]) for p in ("fp32", "bf16")}
    dag = one(rows, section="dag", dims="minimind2-small", cores="1")
    mem = one(rows, section="memory", what="glibc default")
    expected = {
        "fp32 step ÷ transformers fp32 step": (float(step["fp32"]["vs_hf_same_precision_paired"]), 0.80, True),
        "bf16 step ÷ transformers fp32 step": (float(step["bf16"]["vs_hf_fp32_paired"]), 0.30, True),
        "fp32 step's matmul share": (float(step["fp32"]["gflops"]) / rate["fp32"], 0.60, False),
        "bf16 step's matmul share": (float(step["bf16"]["gflops"]) / rate["bf16"], 0.60, False),
        "DAG overhead ÷ training time, minimind2-small":
            ((float(dag["median_ms"]) - float(dag["train_ms"])) / float(dag["train_ms"]), 0.10, True),
        "peak RSS": (float(mem["peak_rss_mib"]) * 1024 * 1024 / 1e9, 1.1, True),
    }
    stall, train = one(rows, section="cost", what="stall per save"), one(rows, section="cost", what="training time, checkpoints async")
    auto = one(rows, section="cost", what="training time, checkpoints auto")
    expected.update({
        "stall per save, checkpoint.async ÷ sync": (float(stall["async_ms"]) / float(stall["sync_ms"]), 0.15, True),
        "training time, a checkpoint every 10 steps ÷ none, async":
            (float(train["seconds"]) / float(train["none_seconds"]), 1.03, True),
        "overhead measured with every: auto": (float(auto["seconds"]) / float(auto["none_seconds"]) - 1, 0.025, True),
    })
    for mode in ("sync", "async"):
        pre = one(rows, section="cost", what=f"preemption latency, {mode}")
        expected[f"preemption latency, SIGTERM to a committed checkpoint, {mode}"] = \
            (float(pre["latency_s"]) / float(pre["limit_s"]), 1.0, True)
    for prefix, (value, limit, below) in expected.items():
        (target,) = [t for t in targets if t.startswith(prefix)]
        shown_limit, measured, met = targets[target]
        assert abs(float(measured) - value) <= 5e-4 + 1e-3 * abs(value), (target, measured, value)
        assert float(shown_limit.split()[-1].rstrip("%")) / (100 if "%" in shown_limit else 1) == limit
        if "AMX" in target and "amx_bf16 no" in machine:
            assert met.startswith("n/a"), target
        else:
            assert met == ("yes" if (value <= limit if below else value >= limit) else "no"), target
