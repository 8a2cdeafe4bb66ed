"""One environment of the audit across releases: a venv with a framework's release and the releases of the
packages its resume goes through, layered on this environment so that torch (and whatever the release does
not pin otherwise) is this environment's own, bit for bit the same build. Cached: a venv already made for the
same requirements is reused.

  release_env.py --requirements "transformers==4.56.2 accelerate==1.10.1" --env .cache/audit-releases/NAME
                 --out versions.json

versions.json: {requirement's package: installed version, ..., "torch": torch's version, "python": the venv's};
with "skipped": why, where pip cannot install the release here or it needs another torch.
"""

import json
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from mmkit.atomic import write_text_atomic
from mmkit.errors import OneLineParser, UserError, run_cli

COMPLETE = "requirements.txt"  # written last: a venv without it was cut short and is made again


def installed(python: Path, packages: list) -> dict:
    """{package: version} as PYTHON's environment resolves them, torch's included."""
    script = ("import importlib.metadata as m, json, sys; "
              "print(json.dumps({p: m.version(p) for p in sys.argv[1:]}))")
    proc = subprocess.run([str(python), "-c", script, *packages, "torch"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"{python}: cannot read its packages' versions: {proc.stderr.strip().splitlines()[-1]}")
    return json.loads(proc.stdout)


def make(env: Path, requirements: list) -> None:
    """ENV with REQUIREMENTS, built in a folder of its own and renamed into place once complete."""
    building = env.with_name(env.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(building)], check=True)
    # this environment's packages after the venv's own: torch is the pinned build, and a release that needs
    # another version of a dependency gets it in the venv, which comes first on sys.path
    purelib = Path(sysconfig.get_paths(vars={"base": str(building), "platbase": str(building)})["purelib"])
    (purelib / "base-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    print(f"release_env: pip install {' '.join(requirements)}", file=sys.stderr, flush=True)
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(building / "bin" / "python"), "install",
                          "--quiet", *requirements], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if pip.returncode != 0:
        lines = [line for line in pip.stdout.splitlines() if line.strip() and "WARNING" not in line]
        raise UserError(f"pip could not install {' '.join(requirements)}: {lines[-1] if lines else pip.returncode}")
    (building / COMPLETE).write_text("\n".join(requirements) + "\n")
    shutil.rmtree(env, ignore_errors=True)
    building.rename(env)


def main():
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requirements", required=True, help="pip requirements, space-separated: pkg==version ...")
    p.add_argument("--env", required=True, help="the venv's folder (reused when made for the same requirements)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    requirements = args.requirements.split()
    if not requirements or not all(re.fullmatch(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.+-]+", r) for r in requirements):
        raise UserError(f"--requirements: give pinned releases, package==version ... (got {args.requirements!r})")
    pinned = dict(r.split("==") for r in requirements)
    env = Path(args.env)
    import torch

    try:
        if not (env / COMPLETE).exists() or (env / COMPLETE).read_text().split() != requirements:
            make(env, requirements)
        versions = installed(env / "bin" / "python", list(pinned))
        if versions["torch"] != torch.__version__:
            raise UserError(f"needs torch {versions['torch']} (pip's choice), not this environment's "
                            f"{torch.__version__}, which the audit does not vary")
    except UserError as e:  # a release that cannot live beside this torch and Python: its cells say so
        print(f"release_env: skipped: {e}", file=sys.stderr)
        versions = {**pinned, "torch": torch.__version__, "skipped": str(e)}
    wrong = [f"{p}=={v} (got {versions[p]})" for p, v in pinned.items() if versions[p] != v]
    if wrong:
        raise UserError(f"{env}: installed other versions than asked: {', '.join(wrong)}")
    write_text_atomic(args.out, json.dumps({**versions, "python": str(env.resolve() / "bin" / "python")},
                                           indent=1) + "\n")


if __name__ == "__main__":
    run_cli(main)
