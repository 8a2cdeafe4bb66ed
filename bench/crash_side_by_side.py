"""certify --crash and ckpt-chaos 0.1.8 side by side on the same commands, on this machine:

  styles      certify's saver.py (certify/tests/saver.py) in each of its save styles: bench/crash_side_by_side.md
  frameworks  the audit's crash cells' commands (trainer_audit.audit: the Trainer and Lightning example scripts, a
              checkpoint every 3 of 12 steps, each framework's own auto-resume): bench/crash_frameworks.md,
              which docs/audit.md shows (make readme)

ckpt-chaos (https://pypi.org/project/ckpt-chaos/, its README's `run` usage, "Resume contract" with
--checkpoint-glob) is installed with pip --target into .venv/ckpt-chaos for this script alone: it is no
dependency of the lab or of certify.

Scope differs, and the tables say so: ckpt-chaos kills the command at each file event of the whole run
(every save and the final weights), one kill per event and a torn copy per torch.save; certify --crash
rebuilds the states a kill or a power loss leaves of the saves up to step K's and resumes each distinct
state once. Both resume with the script's own auto-resume.

  python bench/crash_side_by_side.py [--part styles|frameworks|both]
"""

import argparse
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAVER = REPO / "certify" / "tests" / "saver.py"
EXAMPLES = REPO / "examples"
CKPT_CHAOS = "ckpt-chaos==0.1.8"
TARGET = Path(sys.prefix) / "ckpt-chaos"
THEIRS = ("PASS", "HARD_FAIL", "SILENT_DIVERGENCE", "LOST_WORK")

STEPS, STOP_AFTER = 6, 4  # saver.py: saves after steps 2, 4 and 6; certify kills before step 5 (two saves)
# the checkpoints ckpt-chaos's --checkpoint-glob names (its LOST_WORK needs them; a name without a step
# number cannot be one): the styles that keep several
GLOBS = {"folders": "{out}/checkpoint-*", "pointer": "{out}/ckpt-*"}
STYLES = ("overwrite", "replace", "durable", "folders", "pointer")

# the final weights' digest, for a checkpoint whose bytes also hold its run's paths (Lightning's callbacks)
DIGEST = ("import hashlib, sys, torch; s = torch.load(sys.argv[1], weights_only=True)['state_dict']; "
          "print(hashlib.sha256(b''.join(s[k].numpy().tobytes() for k in sorted(s))).hexdigest())")
# the audit's crash cells (trainer_audit.audit.SCENARIOS["crash"]: a checkpoint every 3 steps of 12, certify killing
# after step 6's), each with what ckpt-chaos needs to read the resumed step and the final weights
FRAMEWORKS = {
    "transformers": dict(
        command=["trainer_script.py", "--output_dir", "{out}", "--save_steps", "3"],
        resume=["--resume_from_checkpoint", "true"], glob="{out}/checkpoint-*",
        # Trainer's own log line, at info level (TRANSFORMERS_VERBOSITY, transformers' logging docs)
        step=r"Continuing training from global step (\d+)", env={"TRANSFORMERS_VERBOSITY": "info"},
        result=["--result-file", "{out}/checkpoint-12/model.safetensors"]),
    "lightning": dict(
        command=["lightning_script.py", "--out", "{out}", "--every", "3", "--save_last"],
        resume=["--ckpt_path", "last"], glob="{out}/step=*.ckpt", step=r"training from step (\d+)", env={},
        result=["--result-cmd", f"{sys.executable} -c \"{DIGEST}\" {{out}}/step=12.ckpt"]),
}
FRAMEWORK_STOP_AFTER, FRAMEWORK_POINTS = 6, 16


def ckpt_chaos(command: list, work: Path, glob: str | None, step: str, result: list, resume: list | None = None,
               env: dict | None = None, max_points: int = 40) -> dict:
    """ckpt-chaos run on COMMAND ({out} for its folder): {verdict: count}."""
    if not (TARGET / "ckpt_chaos").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", TARGET, CKPT_CHAOS], check=True)
    options = ["--checkpoint-glob", glob] if glob else []
    if resume:
        options += ["--resume-cmd", " ".join([*map(str, command), *resume])]
    proc = subprocess.run([sys.executable, "-m", "ckpt_chaos", "run", "--step-regex", step, *result, *options,
                           "--max-points", str(max_points), "--fail-on", "HARD_FAIL,SILENT_DIVERGENCE", "--",
                           *map(str, command)], capture_output=True, text=True, cwd=work,
                          env={"PYTHONPATH": str(TARGET), "PATH": os.environ["PATH"], **(env or {})})
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""  # "LOST_WORK: 9  PASS: 13"
    found = {name: int(n) for name, n in re.findall(r"([A-Z_]+): (\d+)", last)}
    if not found:
        raise SystemExit(f"ckpt-chaos gave no counts (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return found


def certify(command: list, out: Path, stop_after: int, resume: list | None = None, max_points: int = 64) -> dict:
    """certify --crash on COMMAND ({run} for its folder): crash.json."""
    subprocess.run([sys.executable, "-m", "certkit", "--crash", "--out", out, "--stop-after", str(stop_after),
                    "--max-points", str(max_points), "--resume", " ".join(resume or []), "--",
                    *map(str, command)], capture_output=True, text=True, cwd=out.parent)
    return json.loads((out / "crash.json").read_text())


def cpu() -> str:
    info = Path("/proc/cpuinfo").read_text()
    flags = set(re.search(r"^flags\s*:(.*)$", info, re.M)[1].split())
    model = re.search(r"^model name\s*:(.*)$", info, re.M)[1].strip()
    return f"{model}; " + ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in ("avx2", "avx512f", "amx_tile"))


def counts(found: dict, model: str) -> str:
    return " / ".join(str(n) for n in found["counts"][model].values())


HEADER = ("ckpt-chaos: " + " / ".join(THEIRS) + " | certify, process crash: exact / lost work / started over / "
          "hard fail / silent | certify, power loss: (the same) |")


def styles(work: Path) -> str:
    rows = []
    for style in STYLES:
        command = [sys.executable, SAVER, "--save", style, "--steps", str(STEPS)]
        print(f"[side by side] {style}: ckpt-chaos ...", file=sys.stderr, flush=True)
        theirs = ckpt_chaos([*command, "--out", "{out}"], work, GLOBS.get(style), r"resumed from step (\d+)",
                            ["--result-file", "{out}/final.pt"])
        print(f"[side by side] {style}: certify --crash ...", file=sys.stderr, flush=True)
        ours = certify([*command, "--out", "{run}"], work / f"certify-{style}", STOP_AFTER)
        rows.append(f"| {style} | " + " / ".join(str(theirs.get(v, 0)) for v in THEIRS)
                    + f" | {counts(ours, 'process crash')} | {counts(ours, 'power loss')} |")
    return "\n".join([
        "# certify --crash and ckpt-chaos on the same commands", "",
        f"`python bench/crash_side_by_side.py --part styles`, {CKPT_CHAOS}, on {cpu()}. The command: "
        f"`python certify/tests/saver.py --out DIR --save STYLE --steps {STEPS}` (a checkpoint every 2 steps, "
        "auto-resume). ckpt-chaos: every file event of the run (a kill before it; a torn copy for torch.save). "
        f"certify: the saves up to step {STOP_AFTER}'s (the kill before step {STOP_AFTER + 1}), each distinct "
        "state once, per failure model. The frameworks' commands: crash_frameworks.md.", "",
        f"| style | {HEADER}", "|---|---|---|---|", *rows]) + "\n"


def frameworks(work: Path) -> str:
    rows = []
    for name, f in FRAMEWORKS.items():
        command = [sys.executable, EXAMPLES / f["command"][0], *f["command"][1:]]
        print(f"[side by side] {name}: ckpt-chaos ...", file=sys.stderr, flush=True)
        theirs = ckpt_chaos(command, work, f["glob"], f["step"], f["result"], f["resume"], f["env"],
                            max_points=2 * FRAMEWORK_POINTS)
        print(f"[side by side] {name}: certify --crash ...", file=sys.stderr, flush=True)
        ours = certify([t.replace("{out}", "{run}") if isinstance(t, str) else t for t in command],
                       work / f"certify-{name}", FRAMEWORK_STOP_AFTER, f["resume"], FRAMEWORK_POINTS)
        rows.append(f"| {name} {importlib.metadata.version(name)} | {' '.join(f['resume'])} | "
                    + " / ".join(str(theirs.get(v, 0)) for v in THEIRS)
                    + f" | {counts(ours, 'process crash')} | {counts(ours, 'power loss')} |")
    return "\n".join([
        f"`make bench-crash` (bench/crash_side_by_side.py --part frameworks), {CKPT_CHAOS}, torch "
        f"{importlib.metadata.version('torch').split('+')[0]}, on {cpu()}, 1 process. The audit's crash cells' "
        "commands (a checkpoint every 3 of 12 steps), resumed through the framework's auto-resume. ckpt-chaos: "
        f"at most {2 * FRAMEWORK_POINTS} of the run's file events (a kill before each; a torn copy per "
        f"torch.save and safetensors write), a verdict per kill. certify: every crash point of the saves up to "
        f"step {FRAMEWORK_STOP_AFTER}'s (a kill before each file event, a torn write; each state a power loss "
        f"may leave), {FRAMEWORK_POINTS} of their distinct states resumed, spread evenly; a count per point "
        "whose state was resumed (points that leave the same bytes share one resume).", "",
        f"| framework | auto-resume | {HEADER}", "|---|---|---|---|---|", *rows]) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("styles", "frameworks", "both"), default="both")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "crash_side_by_side.md")
    p.add_argument("--out-frameworks", type=Path, default=REPO / "bench" / "crash_frameworks.md")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for part, out, make in (("styles", args.out, styles), ("frameworks", args.out_frameworks, frameworks)):
            if args.part in (part, "both"):
                out.write_text(make(Path(tmp)))
                print(out.read_text())


if __name__ == "__main__":
    main()
