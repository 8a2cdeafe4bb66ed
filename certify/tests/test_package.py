"""certify as a user installs it: the wheel built from certify/, installed into a fresh venv that holds
nothing but torch and numpy (and what torch itself requires), linked in from this environment rather than
downloaded; there, the `certify` command on a plain training script.

Each test names the breakage it catches.
"""

import importlib.metadata
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

HERE = Path(__file__).parent
DISTRIBUTION = HERE.parent
TRAIN = HERE / "train.py"


def requirement_names(dist: str) -> list:
    """DIST's requirements by name, without extras' and markers' ones."""
    return [r.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip()
            for r in importlib.metadata.requires(dist) or [] if "extra ==" not in r]


def linked(names, found=None) -> dict:
    """{distribution: its files' top folders or modules} for NAMES and everything they require, as this
    environment has them installed."""
    found = {} if found is None else found
    for name in names:
        dist = importlib.metadata.distribution(name)
        key = dist.metadata["Name"].lower()
        if key in found:
            continue
        tops = {Path(str(f)).parts[0] for f in dist.files if not str(f).startswith("..")}
        found[key] = {dist.locate_file(t) for t in tops if not t.endswith(".pth") and t != "__pycache__"}
        linked(requirement_names(name), found)
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # no build isolation: setuptools is here already (torch requires it); nothing is downloaded
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", out,
                    DISTRIBUTION], check=True, capture_output=True)
    return next(out.glob("*.whl"))


@pytest.fixture(scope="module")
def fresh(wheel, tmp_path_factory) -> dict:
    """A fresh venv with torch and numpy linked in and the wheel installed: the environment to run it in."""
    root = tmp_path_factory.mktemp("venv")
    venv.create(root, with_pip=True)
    python = root / "bin" / "python"
    # the venv's own setuptools (ensurepip's) is older than the one torch requires, which is linked below
    subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", "setuptools"], check=True, capture_output=True)
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    shelf = root / "linked"  # only these, so that nothing else of this environment is importable there
    shelf.mkdir()
    for paths in linked(["torch", "numpy"]).values():
        for path in paths:
            (shelf / path.name).symlink_to(path)
    (site / "linked.pth").write_text(f"{shelf}\n")
    proc = subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", wheel], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "PATH": f"{root / 'bin'}{os.pathsep}{env['PATH']}", "OMP_NUM_THREADS": "1"}


def test_the_wheel_holds_only_the_package_and_declares_only_torch_and_numpy(wheel):
    """Catches: the lab (mmkit, workflow, tests) shipped in the wheel, the recorder's sitecustomize left out
    (certify could record nothing), or a dependency beyond torch and numpy."""
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"certkit", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1]
                                                + ".dist-info"}
    assert "certkit/site/sitecustomize.py" in names and "certkit/cli.py" in names
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    requires = sorted(line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist"))
    assert requires == ["numpy", "torch>=2.1"]


def test_in_a_fresh_venv_the_command_certifies_a_script_exact_and_names_what_a_forgetful_one_forgot(fresh, tmp_path):
    """Catches: an install without the `certify` command or `python -m certkit`, a package that needs this
    repository (mmkit, its folders) to run, and a verdict that differs from the one in the lab."""
    lab = subprocess.run(["python", "-c", "import mmkit"], env=fresh, capture_output=True, text=True)
    assert lab.returncode != 0, "the fresh venv sees the lab's packages"
    assert subprocess.run(["certify", "--help"], env=fresh, capture_output=True, text=True).stdout.startswith("usage: certify")
    verdicts = {}
    for name, forget in (("exact", ""), ("forgetful", " --forget-sampler")):
        out = tmp_path / name
        proc = subprocess.run(["python", "-m", "certkit", "--out", out, "--stop-after", "3",
                               f"--resume=--resume {{run}}/ckpt_{{step:04d}}.pt{forget}", "--", "python", TRAIN,
                               "--out", "{run}"], env=fresh, capture_output=True, text=True, cwd=tmp_path, timeout=300)
        verdicts[name] = proc.returncode, proc.stdout
    assert verdicts["exact"][0] == 0 and verdicts["exact"][1].startswith("exact"), verdicts
    assert verdicts["forgetful"][0] == 1, verdicts
    assert "first difference at step 4, rank 0: samples" in verdicts["forgetful"][1], verdicts
