# What code each job runs: its script, the local modules the script imports, and how a training job is
# started. The modules are declared as the job's inputs, so that editing one reruns exactly the jobs
# whose scripts import it, and what follows.

import ast
import re
import shlex
from functools import cache


def installed_root(package):
    """The folder that holds PACKAGE as this Python imports it (mmkit and trainer_audit: src, certkit:
    certify/src, each installed editable), relative to the working directory when it is inside it.
    """
    import importlib.util

    root = Path(importlib.util.find_spec(package).submodule_search_locations[0]).parent
    inside = root.resolve().is_relative_to(Path.cwd().resolve())
    return Path(os.path.relpath(root)) if inside else root


INSTALLED_ROOTS = tuple(
    dict.fromkeys(installed_root(p) for p in ("mmkit", "trainer_audit", "certkit"))
)
# the certify command's code: its entry module (and, through code_inputs, all it imports) and the
# sitecustomize it loads the recorder with
CERTIFY_CODE = [
    str(installed_root("certkit") / "certkit" / f)
    for f in ("cli.py", "site/sitecustomize.py")
]


def code_inputs(script):
    """The local modules SCRIPT imports, directly or through one another, found in their source when the
    DAG is parsed (a new module in the package needs no list kept by hand). Local: the modules of this
    repository's packages (src/, certify/src/), each package's __init__.py on the way, and modules beside
    the script.
    Imports inside functions count: they run too.
    """
    script = Path(script)
    # a copy of the workflow without bench/: the rule's script input says what is missing
    if not script.is_file():
        return []
    # where `python script` finds them: the script's folder, then this repository's installed distributions
    # (the lab's package: src/; certkit: certify/src/; each installed editable)
    roots = (script.parent, *INSTALLED_ROOTS)
    found, todo = set(), [(script, "__main__")]
    while todo:
        for path, module in imported_files(*todo.pop(), roots):
            if path not in found:
                found.add(path)
                todo.append((path, module))
    return sorted(str(path) for path in found if path != script)


@cache
def imported_files(path, module, roots):
    """(file, module name) of each local module that the source of PATH (module MODULE) imports."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from .x import y: relative to the package holding PATH
                parent = package.rsplit(".", node.level - 1)[0]
                base = f"{parent}.{base}" if base else parent
            names.append(base)
            # from mmkit import data: a module, not a name defined in mmkit/__init__.py
            names += [f"{base}.{alias.name}" for alias in node.names]
    return [found for name in names for found in module_files(name, roots)]


def module_files(name, roots):
    """(file, module name) of the module NAME and of each package above it, from the first root holding
    its top package; none for a module that is not local (torch, a name imported from a module).
    """
    parts = name.split(".")
    for root in roots:
        if not ((root / parts[0]).is_dir() or (root / f"{parts[0]}.py").is_file()):
            continue
        files = []
        for i in range(1, len(parts) + 1):
            stem = root.joinpath(*parts[:i])
            if (stem / "__init__.py").is_file():
                files.append((stem / "__init__.py", ".".join(parts[:i])))
            elif stem.with_suffix(".py").is_file():
                files.append((stem.with_suffix(".py"), ".".join(parts[:i])))
                break
            else:
                break
        return files
    return []


# torchrun itself, which also passes SIGUSR1 on to the ranks and exits 75 when they were preempted
TORCHRUN = SCRIPTS / "torchrun.py"


def launch(world_size):
    """How a training job starts: one plain process, or torchrun's ranks (never a home-made spawner)."""
    if world_size == 1:
        return "python"
    # OMP_NUM_THREADS silences torchrun's warning; each rank sets its own torch threads from the config
    return f"OMP_NUM_THREADS={config['threads']} python {TORCHRUN} --standalone --nproc-per-node {world_size}"


def training_code(world_size):
    """The code a training job runs: run.py's modules, and the launcher when it has several ranks."""
    return code_inputs(SCRIPTS / "run.py") + ([str(TORCHRUN)] if world_size > 1 else [])


# The audit's scripts (workflow/rules/audit.smk): each row's cells certify its framework's example;
# lightning_stateful is Lightning's with --stateful_loader
AUDIT_SCRIPTS = {
    "own": SCRIPTS / "run.py",
    "transformers": "examples/trainer_script.py",
    "accelerate": "examples/accelerate_loop.py",
    "lightning": "examples/lightning_script.py",
    "lightning_stateful": "examples/lightning_script.py",
}


def audit_script(w):
    return AUDIT_SCRIPTS[w.framework]


def own_inputs(w):
    """The own row's run.py settings and data: its preset, MiniMind's JSONL documents and the tokenizer."""
    if w.framework != "own":
        return {}
    return dict(
        preset="presets/certify-own.yaml",
        jsonl=f"{OUT}/data/train.jsonl",
        tokenizer=f"{OUT}/data/tokenizer.json",
        tokens=TRAIN_TOKENS,
    )


def straight_source(w):
    """The cell whose straight run this cell's certify reuses (trainer_audit.audit.straight_source), or None."""
    from trainer_audit.audit import straight_source

    return straight_source(w.framework, w.scenario, config["audit"]["scenarios"])


# certify's entries (workflow/rules/certify.smk): a command of the config, and the files it names
def certify_command(name):
    return config["certify"][name]["command"].replace("{outdir}", OUT)


def certify_files(w):
    """The files an entry's command names: the repository's (examples, scripts, presets, and the modules a
    script imports) and OUTDIR's (built by their rules), so that a changed example reruns its entry.
    """
    named = (t.split("=", 1)[-1] for t in shlex.split(certify_command(w.name)))
    files = [
        t
        for t in named
        if "{" not in t and (t.startswith(f"{OUT}/") or Path(t).is_file())
    ]
    return files + [m for f in files if f.endswith(".py") for m in code_inputs(f)]


# The audit across releases (workflow/rules/audit.smk): each release environment by its name, with its
# framework's package and its requirements
from trainer_audit.audit import PACKAGES as AUDIT_ROWS, SCENARIOS as AUDIT_SCENARIOS
from trainer_audit.audit import release_name, rows_of_package

RELEASE_ENVS = {
    release_name(requirements): (package, requirements)
    for package, releases in config["audit_releases"]["releases"].items()
    for requirements in releases
}


def release_cells(cell):
    """CELL (a path with {release}, {framework}, {scenario}) for every release, row of its package, and
    scenario of config audit_releases."""
    return [
        cell.format(release=name, framework=row, scenario=scenario)
        for name, (package, _) in RELEASE_ENVS.items()
        for row in rows_of_package(package)
        for scenario in config["audit_releases"]["scenarios"]
    ]
