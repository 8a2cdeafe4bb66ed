"""The rules between the parts that docs/architecture.md states, checked on every module's syntax tree.

Each test names the breakage it catches. The imports are read with ast (absolute, relative, and those inside
functions), so an import moved into a function to dodge a rule is still found.
"""

import ast
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import REPO, SCRIPTS, SRC

PACKAGES = ("mmkit", "certkit", "trainer_audit")
FOLDERS = {"mmkit": SRC / "mmkit", "certkit": REPO / "certify" / "src" / "certkit",  # certkit: its own distribution
           "trainer_audit": SRC / "trainer_audit"}
# mmkit's modules that save, load or describe a checkpoint: its checkpoint package, and these beside it
CHECKPOINT_CODE = ("atomic", "fingerprint", "ablations", "preemption")


def packages(package: str) -> list:
    """PACKAGE's folder and its subpackages' (each a folder with an __init__.py)."""
    return [f.parent for f in sorted(FOLDERS[package].rglob("__init__.py"))]


def modules(package: str) -> dict:
    """{module name: its file} of PACKAGE and its subpackages ('checkpoint.manager'), each __init__ as its
    package's own name ('mmkit', 'checkpoint')."""
    found = {}
    for folder in packages(package):
        for f in sorted(folder.glob("*.py")):
            parts = f.relative_to(FOLDERS[package]).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts) or package] = f
    return found


def imported(path: Path, package: str) -> set:
    """What the module at PATH imports: 'mmkit.train', 'certkit', 'torch', a script's name; relative imports
    resolved against the package PATH lies in (from . import x, from ..x import y), PACKAGE or one of its
    subpackages."""
    root = FOLDERS.get(package)
    home = [package, *(path.parent.relative_to(root).parts if root and path.is_relative_to(root) else ())]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: within the package, node.level - 1 folders up
                base = ".".join(home[:len(home) - node.level + 1])
                if node.module:
                    found.add(f"{base}.{node.module}")
                else:
                    found |= {f"{base}.{alias.name}" for alias in node.names}
            else:
                found.add(node.module)
                found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


@pytest.mark.quick
def test_the_parser_of_imports_sees_every_form_of_import(tmp_path):
    """Catches: a rule check blind to a relative import, a 'from . import x', an import inside a function,
    or an absolute 'from mmkit import x' (each would let a forbidden import through)."""
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom .data import StepPlan\nfrom . import train\n"
                      "def f():\n    from mmkit import checkpoint\n    import certkit.verdict\n")
    assert imported(module, "mmkit") >= {"os", "mmkit.data", "mmkit.train", "mmkit.checkpoint", "certkit.verdict"}


@pytest.mark.quick
def test_certify_and_the_lab_import_nothing_of_each_other():
    """Catches: certkit reaching into mmkit (certify would then need this project's training code), or the
    lab's package importing certify's internals."""
    for package, other in (("mmkit", "certkit"), ("certkit", "mmkit")):
        for name, path in modules(package).items():
            crossing = {m for m in imported(path, package) if m == other or m.startswith(other + ".")}
            assert not crossing, f"{package}/{path.name} imports {sorted(crossing)}"


# what certify loads into the user's process: the site hook and everything it imports, no more (docs/certify.md)
IN_PROCESS = {"recorder", "digest", "watch", "fileevents", "crashstates"}
JUDGEMENT = ("verdict", "diagnosis", "reports")


def certkit_graph() -> dict:
    """{certkit module: the certkit modules it imports}, the site hook's sitecustomize as 'site.sitecustomize'."""
    files = {**modules("certkit"), "site.sitecustomize": FOLDERS["certkit"] / "site" / "sitecustomize.py"}
    graph = {}
    for name, path in files.items():
        found = {m.removeprefix("certkit.") for m in imported(path, "certkit") if m.startswith("certkit.")}
        graph[name] = {m.split(".")[0] for m in found if m.split(".")[0] in files and m.split(".")[0] != name}
    return graph


@pytest.mark.quick
def test_what_certify_loads_into_the_users_process_imports_nothing_of_the_orchestration_and_no_cycle():
    """Catches: a module the site hook loads into someone else's training process importing certify's
    orchestration or judgement (runs, saves, verdict: their imports, their module-level code and their
    failures would then run inside the user's program), and an import cycle anywhere in certkit (recorder ->
    saves -> runs -> verdict -> recorder was one)."""
    graph = certkit_graph()
    loaded, todo = set(), ["site.sitecustomize"]
    while todo:
        name = todo.pop()
        if name not in loaded:
            loaded.add(name)
            todo += sorted(graph.get(name, ()))
    assert loaded - {"site.sitecustomize"} == IN_PROCESS, sorted(loaded)
    for name in JUDGEMENT:  # the judgement reads certificates; it never starts a run
        assert not graph[name] & {"runs", "saves", "cli", "processes", "progress"}, (name, sorted(graph[name]))

    def cycle(name, path):
        for other in sorted(graph.get(name, ())):
            if other in path:
                return path[path.index(other):] + [other]
            found = cycle(other, path + [other])
            if found:
                return found
        return None

    for name in graph:
        assert cycle(name, [name]) is None, " -> ".join(cycle(name, [name]))


@pytest.mark.quick
def test_checkpoint_code_never_imports_the_training_loop_nor_the_data_module():
    """Catches: a checkpoint module that imports train (the loop would then be inside its own I/O), or data
    (the checkpoint would then rebuild a data position the data module owns)."""
    mmkit = modules("mmkit")
    checkpoint_code = [n for n in mmkit if n in CHECKPOINT_CODE or n.split(".")[0] == "checkpoint"]
    assert len(checkpoint_code) == len(CHECKPOINT_CODE) + 6, checkpoint_code  # the package and its 5 modules
    for name in checkpoint_code:
        found = imported(mmkit[name], "mmkit")
        assert "mmkit.train" not in found, f"{name} imports the training loop"
        assert "mmkit.data" not in found, f"{name} imports mmkit.data"


@pytest.mark.quick
def test_the_packages_never_import_a_script_and_errors_is_a_leaf():
    """Catches: a package module importing a workflow script (a cycle through the scripts' path), or
    errors.py importing the package (every module imports it)."""
    scripts = {f.stem for f in SCRIPTS.glob("*.py")}
    for package in PACKAGES:
        for name, path in modules(package).items():
            found = imported(path, package)
            assert not scripts & {m.split(".")[0] for m in found}, f"{package}/{path.name} imports a script"
    assert not {m for m in imported(modules("mmkit")["errors"], "mmkit") if m.startswith("mmkit")}


@pytest.mark.quick
def test_every_module_of_both_packages_is_on_the_map():
    """Catches: a module added to mmkit or certkit that docs/architecture.md's layout does not name."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    for package in PACKAGES:
        for name, path in modules(package).items():
            if path.stem != "__init__":
                assert path.name in doc, f"docs/architecture.md does not name {package}/{path.name}"


def listed(docstring: str) -> set:
    """The modules and subpackages a package docstring's layout lists: each line '  name.py[, other.py]  what
    it holds', or '  name/  what it holds'."""
    found = set()
    for line in docstring.splitlines():
        m = re.match(r"^  (\w+\.py(?:, \w+\.py)*|\w+/)\s", line)
        if m:
            found |= set(m[1].split(", "))
    return found


@pytest.mark.quick
def test_the_docs_name_only_what_exists_and_each_package_lists_its_modules():
    """Catches: a module renamed or removed while docs/architecture.md or its package's docstring still names
    it, and a module added that its package's docstring does not list (mmkit's once named 10 of 22)."""
    for folder in (f for package in PACKAGES for f in packages(package)):
        files = {f.name for f in folder.glob("*.py") if not f.stem.startswith("__")}
        files |= {d.name + "/" for d in folder.iterdir() if d.is_dir() and any(d.glob("*.py"))}
        docstring = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
        assert listed(docstring) == files, f"{folder.name}/__init__.py's list: {listed(docstring) ^ files} differ"
    layout = (REPO / "docs" / "architecture.md").read_text().split("```")[1]
    tracked = set(subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                                 check=True).stdout.split())
    names = {Path(t).name for t in tracked} | {part for t in tracked for part in Path(t).parts[:-1]}
    named = set(re.findall(r"[\w.-]+\.(?:py|smk|sh|yaml)\b", layout))
    assert named, "the parser of docs/architecture.md's layout found no file name in it"
    assert named <= names, f"docs/architecture.md names files that do not exist: {sorted(named - names)}"


# the fork servers' children: each sets sys.path as the interpreter it stands in for would have at its start
# (`python SCRIPT`: the script's folder first; `python -m pytest`: PYTHONPATH's entries), nothing else
STANDS_IN_FOR_AN_INTERPRETER = {("tests/launch.py", "_child"), ("tests/mutants.py", "pytest_child")}


def is_sys_path(node) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
            and node.value.id == "sys")


def sys_path_edits(path: Path) -> list:
    """'file:line' of each statement of PATH that changes sys.path: a call of its methods, an assignment to it
    or to a slice of it, outside the functions allowed above."""
    rel = path.relative_to(REPO).as_posix()
    tree = ast.parse(path.read_text())
    allowed = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
               and (rel, f.name) in STANDS_IN_FOR_AN_INTERPRETER for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        if id(node) in allowed:
            continue
        changed = (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_sys_path(node.func.value)
                   and node.func.attr in ("insert", "append", "extend", "remove", "pop", "clear"))
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            changed = any(is_sys_path(t) or (isinstance(t, ast.Subscript) and is_sys_path(t.value)) for t in targets)
        if changed:
            found.append(f"{rel}:{node.lineno}")
    return found


@pytest.mark.quick
def test_no_script_rule_test_or_benchmark_reaches_a_package_by_editing_sys_path():
    """Catches: a file under workflow/, tests/ or bench/ that finds mmkit (or any package) by putting a folder
    on sys.path instead of importing what is installed: it then runs code the install does not name, and a
    test of a copy of the workflow would run the repository's package instead of the copy's."""
    files = [p for d in ("workflow", "tests", "bench") for p in (REPO / d).rglob("*.py")]
    edits = [e for p in sorted(files) for e in sys_path_edits(p)]
    rules = [REPO / "Snakefile", *(REPO / "workflow" / "rules").glob("*.smk")]  # not Python's grammar: by text
    edits += [f"{p.relative_to(REPO)}:{i}" for p in rules for i, line in enumerate(p.read_text().splitlines(), 1)
              if "sys.path" in line and not line.lstrip().startswith("#")]
    assert len(files) > 60 and not edits, edits


@pytest.mark.quick
def test_run_py_stays_short_and_no_function_does_several_jobs():
    """Catches: the checkpoint policy or other library work growing back into run.py (issue 37: at most 120
    lines, no function over 40), a function anywhere in workflow/scripts, src/ or certkit over 60 lines
    (several jobs in one), and manager.resume gathering more than 4 parameters again (its options belong in
    ResumeOptions)."""
    run_py = SCRIPTS / "run.py"
    assert len(run_py.read_text().splitlines()) <= 120
    long = []
    for path in sorted([*SCRIPTS.glob("*.py"), *SRC.rglob("*.py"), *FOLDERS["certkit"].rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > (40 if path == run_py else 60):
                    long.append(f"{path.relative_to(REPO)}:{node.name} ({lines} lines)")
    assert not long
    resume = next(n for n in ast.parse((SRC / "mmkit" / "checkpoint" / "manager.py").read_text()).body
                  if isinstance(n, ast.FunctionDef) and n.name == "resume")
    assert len(resume.args.args) + len(resume.args.kwonlyargs) <= 4


@pytest.mark.quick
def test_run_py_loads_once_and_saves_once_through_the_checkpoint_manager():
    """Catches: a second way into or out of a checkpoint growing back into run.py (issue 49 counted two loads,
    store.resume and resume_newest, and three saves, save_atomic among them), or run.py reaching past the
    manager into the checkpoint package's modules, or calling torch's save or load itself."""
    tree = ast.parse((SCRIPTS / "run.py").read_text())
    taken = [(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
             and (n.module or "").startswith("mmkit.checkpoint") for a in n.names]
    assert taken == [("mmkit.checkpoint.manager", "CheckpointManager")], taken
    managers = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                and getattr(n.value.func, "id", "") == "CheckpointManager" for t in n.targets}
    assert managers, "run.py builds no CheckpointManager"
    called = [n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
              and getattr(n.func.value, "id", "") in managers]
    assert (called.count("load"), called.count("save")) == (1, 1), called
    by_torch = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in ("save", "load")
                and getattr(n.value, "id", "") == "torch"]
    assert not by_torch and "torch" not in imported(SCRIPTS / "run.py", "mmkit"), by_torch


@pytest.mark.quick
def test_the_audit_declares_no_piece_of_certify_and_tells_failures_apart_by_type():
    """Catches: the audit keeping its own copy of certify's piece names (one such copy had lost rng_cuda), or
    deciding what a failure was by reading its message (str(e).startswith("resume failed")): a message
    reworded in certify would then turn a framework's failed resume into a stopped audit, or the reverse."""
    from certkit.recorder import PIECES

    pieces = set(PIECES) | {"missing"}
    files = [*modules("trainer_audit").values(), *SCRIPTS.glob("audit_*.py")]
    for path in files:
        tree = ast.parse(path.read_text())
        literals = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)}
        assert not pieces & literals, f"{path.name} names certify's pieces {sorted(pieces & literals)} itself"
        for handler in (n for n in ast.walk(tree) if isinstance(n, ast.ExceptHandler) and n.name):
            read = [n for n in ast.walk(handler) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and n.func.attr in ("startswith", "endswith", "find", "index")
                    and isinstance(n.func.value, ast.Call) and getattr(n.func.value.func, "id", "") == "str"
                    and any(getattr(a, "id", "") == handler.name for a in n.func.value.args)]
            assert not read, f"{path.name}:{read[0].lineno} tells a failure apart by its text"


@pytest.mark.quick
def test_the_readmes_test_command_is_the_one_make_test_runs():
    """Catches: the README showing a pytest command that differs from the Makefile's (one that fails as written,
    as it did without PYTHONPATH=tests)."""
    readme = re.search(r"make test .*runs: (.*)", (REPO / "README.md").read_text())[1]
    makefile = (REPO / "Makefile").read_text()
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.M)[1]
    workers = re.search(r"^TEST_WORKERS \?= (\d+)$", makefile, re.M)[1]
    pytest_variable = re.search(r"^PYTEST := (.*)$", makefile, re.M)[1]
    recipe = " ".join(line.strip().rstrip("\\") for line in recipe.splitlines())
    recipe = recipe.replace("$(PYTEST)", pytest_variable).replace("$(TEST_WORKERS)", workers)
    pytest_part = "PYTHONPATH=tests python -m pytest"
    assert pytest_part in recipe, "the Makefile's test recipe no longer runs python -m pytest with PYTHONPATH=tests"
    assert readme.startswith("PATH=$PWD/.venv/bin:$PATH ")  # what $(RUN) puts first
    assert " ".join(readme[readme.index(pytest_part):].split()) == " ".join(recipe[recipe.index(pytest_part):].split())


def test_each_ablation_is_spelled_once_and_the_pipeline_trains_each_as_its_job(tmp_path):
    """Catches: an ablation's flag spelled again beside mmkit.ablations' table (a rule file's own copy, which
    a renamed flag leaves behind), and an ablation the table declares that no training job runs, or runs
    under another name or without --reshard where it needs it. (The job names stay in analysis.smk's
    VARIANTS: the report's row order, and each new path's condition.)"""
    from mmkit.ablations import ABLATIONS

    rules = {f.name: f.read_text() for f in [REPO / "Snakefile", *(REPO / "workflow" / "rules").glob("*.smk")]}
    for a in ABLATIONS.values():
        spelled = [name for name, text in rules.items() if re.search(rf"{re.escape(a.flag)}\b", text)]
        assert not spelled, f"{a.flag} spelled in {spelled}: take it from mmkit.ablations.ABLATIONS"
    # the dry run's training jobs, every path on (the minimind format, dropout, fp16): each ablation's job runs
    # run.py with its flag (and --reshard where it needs it)
    (tmp_path / "paths.yaml").write_text(yaml.safe_dump({"precision": "fp16", "model": {"dropout": 0.1},
                                                         "data": {"format": "minimind"}}))
    proc = subprocess.run(["snakemake", "-n", "-p", "--cores", "1", "--forceall", "all", "dist", "--configfile",
                           "config.yaml", tmp_path / "paths.yaml"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for a in ABLATIONS.values():
        runs = [line for line in proc.stdout.splitlines() if "run.py" in line and f"/{a.job}." in line]
        assert runs and all(f" {a.flag}" in line and (" --reshard" in line) == a.reshard for line in runs), (a, runs[:2])
