"""The two install paths (conda and pip) list the same packages at the same versions."""

import re

import pytest
import yaml
from conftest import REPO


def pip_requirements(name: str) -> set[str]:
    reqs = set()
    for line in (REPO / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            reqs |= pip_requirements(line[3:])
        elif line:
            reqs.add(line)
    return reqs


@pytest.mark.quick
def test_environment_yml_and_requirements_list_the_same_packages():
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert set(pip_section) == pip_requirements("requirements-test.txt")


@pytest.mark.quick
def test_torch_is_pinned_to_the_cpu_build_on_disk():
    # an unpinned torch pulls a multi-GB CUDA build
    assert "torch==2.13.0" in pip_requirements("requirements.txt")
    # pinned, but for this repository's own distributions, installed from their folders
    assert all(re.fullmatch(r"[\w.-]+==[\w.]+", r) or re.fullmatch(r"-e \.(/\w+)?", r) and (REPO / r[5:] / "pyproject.toml").is_file()
               for r in pip_requirements("requirements-test.txt"))
