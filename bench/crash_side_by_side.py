"""certify --crash and ckpt-chaos 0.1.8 side by side on the same commands, on this machine: certify's
saver.py (certify/tests/saver.py) in each of its save styles. Writes bench/crash_side_by_side.md.

ckpt-chaos (https://pypi.org/project/ckpt-chaos/, its README's `run` usage) is installed with pip --target
into .venv/ckpt-chaos for this script alone: it is no dependency of the lab or of certify.

Scope differs, and the table says so: ckpt-chaos kills the command at each file event of the whole run
(every save and the final weights), one kill per event and a torn copy per torch.save; certify --crash
rebuilds the states a kill or a power loss leaves of the saves up to step K's and resumes each distinct
state once. Both resume with the script's own auto-resume (no arguments).

  python bench/crash_side_by_side.py [--out bench/crash_side_by_side.md]
"""

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAVER = REPO / "certify" / "tests" / "saver.py"
CKPT_CHAOS = "ckpt-chaos==0.1.8"
TARGET = Path(sys.prefix) / "ckpt-chaos"
STEPS, STOP_AFTER = 6, 4  # saves after steps 2, 4 and 6; certify kills before step 5 (two saves: see saves.py)
# the checkpoints ckpt-chaos's --checkpoint-glob names (its LOST_WORK needs them; a name without a step
# number cannot be one): the styles that keep several
GLOBS = {"folders": "{out}/checkpoint-*", "pointer": "{out}/ckpt-*"}
STYLES = ("overwrite", "replace", "durable", "folders", "pointer")
THEIRS = ("PASS", "HARD_FAIL", "SILENT_DIVERGENCE", "LOST_WORK")


def ckpt_chaos(style: str, work: Path) -> dict:
    if not (TARGET / "ckpt_chaos").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", TARGET, CKPT_CHAOS], check=True)
    glob = ["--checkpoint-glob", GLOBS[style]] if style in GLOBS else []
    proc = subprocess.run([sys.executable, "-m", "ckpt_chaos", "run", "--step-regex", r"resumed from step (\d+)",
                           "--result-file", "{out}/final.pt", *glob, "--fail-on", "HARD_FAIL,SILENT_DIVERGENCE",
                           "--", sys.executable, SAVER, "--out", "{out}", "--save", style, "--steps", str(STEPS)],
                          capture_output=True, text=True, cwd=work, env={"PYTHONPATH": str(TARGET), "PATH": "/usr/bin:/bin"})
    last = proc.stdout.strip().splitlines()[-1]  # "LOST_WORK: 9  PASS: 13"
    return {name: int(n) for name, n in re.findall(r"(\w+): (\d+)", last)}


def certify(style: str, work: Path) -> dict:
    out = work / f"certify-{style}"
    subprocess.run([sys.executable, "-m", "certkit", "--crash", "--out", out, "--stop-after", str(STOP_AFTER), "--",
                    sys.executable, SAVER, "--out", "{run}", "--save", style, "--steps", str(STEPS)],
                   capture_output=True, text=True, cwd=work)
    return json.loads((out / "crash.json").read_text())["counts"]


def cpu() -> str:
    flags = set(re.search(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M)[1].split())
    model = re.search(r"^model name\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M)[1].strip()
    return f"{model}; " + ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in ("avx2", "avx512f", "amx_tile"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "crash_side_by_side.md")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for style in STYLES:
            print(f"[side by side] {style}: ckpt-chaos ...", file=sys.stderr, flush=True)
            theirs = ckpt_chaos(style, Path(tmp))
            print(f"[side by side] {style}: certify --crash ...", file=sys.stderr, flush=True)
            ours = certify(style, Path(tmp))
            rows.append((style, theirs, ours))
    lines = ["# certify --crash and ckpt-chaos on the same commands", "",
             f"`python bench/crash_side_by_side.py`, {CKPT_CHAOS}, on {cpu()}. The command: "
             f"`python certify/tests/saver.py --out DIR --save STYLE --steps {STEPS}` (a checkpoint every 2 steps, "
             "auto-resume). ckpt-chaos: every file event of the run (a kill before it; a torn copy for torch.save). "
             f"certify: the saves up to step {STOP_AFTER}'s (the kill before step {STOP_AFTER + 1}), each distinct "
             "state once, per failure model.", "",
             "| style | ckpt-chaos: " + " / ".join(THEIRS) + " | certify, process crash: exact / lost work / started "
             "over / hard fail / silent | certify, power loss: (the same) |", "|---|---|---|---|"]
    for style, theirs, ours in rows:
        def counts(model):
            return " / ".join(str(n) for n in ours[model].values())
        lines.append(f"| {style} | " + " / ".join(str(theirs.get(v, 0)) for v in THEIRS)
                     + f" | {counts('process crash')} | {counts('power loss')} |")
    args.out.write_text("\n".join(lines) + "\n")
    print(args.out.read_text())


if __name__ == "__main__":
    main()
