"""certify in CI: --junit and --summary on real certify runs of a plain script (one exact, one whose resume
forgets its sampler), the composite action's inputs against the command line, and the pytest entry point in
a project's own suite run in a subprocess.

Each test names the breakage it catches.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt

HERE = Path(__file__).parent
TRAIN = HERE / "train.py"
RESUME = "--resume {run}/ckpt_{step:04d}.pt"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
# a linter for action metadata (action.yml against SchemaStore's schema), from the npm registry:
# https://github.com/mpalmer/action-validator
ACTION_VALIDATOR = "@action-validator/cli@0.6.0"


def certify(*argv, cwd):
    return subprocess.run([sys.executable, "-m", "certkit", *map(str, argv)], capture_output=True, text=True,
                          env=ENV, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def ci(tmp_path_factory):
    """Three certify runs into one JUnit file and one step summary: exact, forgetful, and one that cannot
    judge (a step K the command never reaches)."""
    work = tmp_path_factory.mktemp("ci")
    junit, summary = work / "junit.xml", work / "summary.md"
    runs = {}
    for name, resume, stop in (("exact", RESUME, 3), ("forgetful", RESUME + " --forget-sampler", 3),
                               ("unjudged", RESUME, 8)):
        runs[name] = certify("--out", work / name, "--stop-after", stop, f"--resume={resume}", "--junit", junit,
                             "--summary", summary, "--", "python", TRAIN, "--out", "{run}", cwd=work)
    return runs, junit, summary


def test_junit_has_a_suite_per_run_a_case_per_rank_and_the_failure_names_step_rank_and_piece(ci):
    """Catches: a JUnit file one run overwrites with its own suite, a failure without the verdict's step,
    rank and piece or its diagnosis, counts that disagree with the cases (CI readers show the counts), a run that could not
    judge reported as passing."""
    runs, junit, _ = ci
    assert [p.returncode for p in runs.values()] == [0, 1, 2], [p.stderr[-500:] for p in runs.values()]
    root = ET.parse(junit).getroot()  # the JUnit layout: testsuites > testsuite > testcase > failure | error
    assert root.tag == "testsuites"
    suites = {s.get("name").split(":")[0]: s for s in root.findall("testsuite")}
    assert set(suites) == {"certify exact", "certify forgetful", "certify unjudged"}
    for s in suites.values():
        cases = s.findall("testcase")
        assert int(s.get("tests")) == len(cases)
        assert int(s.get("failures")) == sum(c.find("failure") is not None for c in cases)
        assert int(s.get("errors")) == sum(c.find("error") is not None for c in cases)
    assert int(root.get("tests")) == sum(int(s.get("tests")) for s in suites.values())
    exact, forgetful = suites["certify exact"], suites["certify forgetful"]
    assert [c.get("name") for c in exact.findall("testcase")] == ["rank 0"] and exact.get("failures") == "0"
    failure = forgetful.find("testcase").find("failure")
    # and why: the sampler's generator forgotten, its first batch is drawn again (diagnosis.py's data position)
    assert failure.get("message") == ("first difference at step 4, rank 0: samples (what the model received); "
                                      "why: Data position")
    error = suites["certify unjudged"].find("testcase").find("error")
    assert "optimizer steps" in error.get("message")  # certify's one line: the run never reaches step 9


def test_the_summary_is_markdown_with_the_verdict_the_difference_the_steps_and_the_rerun(ci):
    """Catches: a summary that overwrites the step summary instead of adding to it, one without the verdict,
    the first difference, why, the steps compared or a command that reruns it, and Markdown that does not render
    as headings, a table and code."""
    _, _, summary = ci
    text = summary.read_text()
    tokens = MarkdownIt().enable("table").parse(text)
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert headings == ["certify: exact", "certify: not exact", "Why (step 4, rank 0)", "certify: could not judge"]
    # judged through the first difference (the runs ended there): the evidence is step 4's
    assert "the resumed run's samples at step 4 are the straight run's of step 1" in text
    assert sum(t.type == "table_open" for t in tokens) == 2
    assert "| 0 | step 4: samples (what the model received) |" in text
    assert "Compared: optimizer steps 4..8" in text
    reruns = [t.content.strip() for t in tokens if t.type == "fence"]
    assert len(reruns) == 3 and all(shlex.split(r)[0] == "certify" and "--junit" in r for r in reruns)


def test_the_action_passes_every_input_to_the_command_line_and_splits_the_command_as_a_shell_would(tmp_path):
    """Catches: an action input the command line does not have (or an option the action cannot set), a
    value lost on the way, and a command joined into one word or run through a shell."""
    action = yaml.safe_load((HERE.parent / "action.yml").read_text())
    from certkit.cli import parser

    options = {max(a.option_strings, key=len)[2:] for a in parser()._actions if a.option_strings} - {"help", "summary"}
    assert set(action["inputs"]) == options | {"command"}  # --summary: always $GITHUB_STEP_SUMMARY
    step = action["runs"]["steps"][1]
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "certify").write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    (fake / "certify").chmod(0o755)
    given = {**{k: v.get("default", "") for k, v in action["inputs"].items()},
             "command": "python 'my train.py' --out {run}",
             "stop-after": "3", "resume": "--resume {run}/x.pt", "repair": "true", "junit": "j.xml", "crash": "true",
             "max-points": "7", "jobs": "3", "full": "true"}
    env = {**os.environ, "PATH": f"{fake}:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")}
    for name, value in step["env"].items():  # ${{ inputs.X }}, as the runner fills it in
        env[name] = given[value.removeprefix("${{ inputs.").removesuffix(" }}")]
    proc = subprocess.run(["bash", "-e", "-c", step["run"]], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    argv = json.loads(proc.stdout)
    args = parser().parse_args(argv[:argv.index("--")])
    assert argv[argv.index("--") + 1:] == ["python", "my train.py", "--out", "{run}"]
    assert (args.stop_after, args.resume, args.repair, args.control, str(args.junit), str(args.summary)) == \
        (3, "--resume {run}/x.pt", True, False, "j.xml", str(tmp_path / "summary.md"))
    assert (args.crash, args.max_points, args.jobs, args.failure_model, args.full) == (True, 7, 3, "both", True)


@pytest.fixture(scope="session")
def action_validator():
    """action-validator, installed into this venv's node/ folder (Node.js and npm from apt-get if absent)."""
    prefix = Path(sys.prefix) / "node"
    tool = prefix / "node_modules" / ".bin" / "action-validator"
    if not tool.exists():
        if not shutil.which("npm") and shutil.which("apt-get"):
            wait = ["-o", "DPkg::Lock::Timeout=600"]  # the SLURM test may be installing its packages
            subprocess.run(["apt-get", *wait, "update", "-qq"], check=True, capture_output=True, timeout=900)
            subprocess.run(["apt-get", *wait, "install", "-y", "-qq", "--no-install-recommends", "nodejs", "npm"],
                           check=True, capture_output=True, timeout=900)
        if not shutil.which("npm"):
            pytest.skip("no npm, and no apt-get to install it")
        subprocess.run(["npm", "install", "--prefix", prefix, "--no-audit", "--no-fund", ACTION_VALIDATOR],
                       check=True, capture_output=True, timeout=300)
    return tool


def test_the_action_passes_a_linter_for_action_metadata(action_validator, tmp_path):
    """Catches: an action.yml GitHub would refuse (a misspelt key, an input without a description, a step
    without its shell); and a linter that accepts anything (a copy with one misspelt key must fail)."""
    lint = subprocess.run([action_validator, HERE.parent / "action.yml"], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    (tmp_path / "action.yml").write_text((HERE.parent / "action.yml").read_text().replace("    default:", "    defalt:", 1))
    lint = subprocess.run([action_validator, tmp_path / "action.yml"], capture_output=True, text=True)
    assert lint.returncode == 1 and "'defalt' is not allowed" in lint.stderr, lint.stdout + lint.stderr


def test_the_pytest_fixture_passes_an_exact_resume_and_fails_a_forgetful_one_with_the_verdict(tmp_path):
    """Catches: a fixture pytest does not find where the package is installed, a not-exact resume that passes,
    and a failure whose message is not the verdict's line."""
    (tmp_path / "test_training.py").write_text(f'''
TRAIN = {str(TRAIN)!r}

def test_resumes_exactly(certify_resume):
    certify_resume(["python", TRAIN, "--out", "{{run}}"], stop_after=3, resume={RESUME!r})

def test_forgets_the_sampler(certify_resume):
    certify_resume(["python", TRAIN, "--out", "{{run}}"], stop_after=3, resume={RESUME + " --forget-sampler"!r})
''')
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=line", "--basetemp", tmp_path / "tmp", tmp_path / "test_training.py"],
                          capture_output=True, text=True, env=ENV,  # PYTHONPATH kept: make mutants puts its broken copy first
                          cwd=tmp_path, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout[-3000:]
    said = [line.removeprefix("E").strip() for line in proc.stdout.splitlines() if line.startswith("E ")]
    assert said == ["AssertionError: not exact: first difference at step 4, rank 0: samples (what the model "
                    f"received) ({tmp_path}/tmp/test_forgets_the_sampler0/certify1/verdict.md)"], proc.stdout[-3000:]


def test_verdict_json_is_format_1_and_valid_against_the_schema_the_package_ships(ci):
    """Catches: a verdict.json without its format number, one whose keys or values leave the published
    schema (a reader in another tool would break), and a schema whose pieces drift from the verdict's."""
    import jsonschema
    from certkit import verdict

    schema = json.loads((Path(verdict.__file__).parent / "verdict.schema.json").read_text())
    assert schema["$defs"]["piece"]["enum"] == list(verdict.ORDER)
    runs, junit, _ = ci
    for name in ("exact", "forgetful"):
        found = json.loads((junit.parent / name / "verdict.json").read_text())
        assert found["format"] == 1
        jsonschema.validate(found, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**found, "format": 2}, schema)
