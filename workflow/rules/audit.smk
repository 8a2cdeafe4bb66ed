# The audit of other trainers (snakemake --cores 2 audit): for each framework and scenario of config audit, a
# certify run of the framework's example script (examples/; own: this project's run.py) with the scenario's
# flags: straight, SIGKILLed after its own checkpoint at the cut, resumed through its own documented resume;
# where they differ, repairs that put the named piece back by hand, and in the mid-epoch cell a negative control.

AUDIT = f"{OUT}/audit"
CELL = f"{AUDIT}/{{framework}}/{{scenario}}"
# any cell the audit knows can be built on its own; `audit` builds those of config audit
AUDIT_WILDCARDS = dict(
    framework="|".join(AUDIT_ROWS),
    scenario="|".join(AUDIT_SCENARIOS),
)


rule audit_cell:
    input:
        unpack(own_inputs),
        code=code_inputs(SCRIPTS / "audit_cell.py"),
        script=SCRIPTS / "audit_cell.py",
        example=audit_script,
        example_code=lambda w: code_inputs(audit_script(w)),
        settings=settings("audit"),
        # the cell whose straight run this one reuses (the same command): built first
        straight=lambda w: (
            [f"{AUDIT}/{w.framework}/{straight_source(w)}/cell.json"]
            if straight_source(w)
            else []
        ),
    output:
        # certify's folder beside it is certify's own: it replaces its own files, and a scenario the script
        # cannot run has none
        cell=f"{CELL}/cell.json",
    log:
        f"{OUT}/logs/audit/{{framework}}/{{scenario}}/cell.log",
    wildcard_constraints:
        **AUDIT_WILDCARDS,
    conda:
        ENV
    params:
        cell=lambda w: f"{AUDIT}/{w.framework}/{w.scenario}",
        own=lambda w, input: (
            f"--own-preset {input.preset} --jsonl {input.jsonl} --tokenizer {input.tokenizer}"
            f" --tokens {input.tokens}"
            if w.framework == "own"
            else ""
        ),
        straight=lambda w: (
            f"--straight-from {AUDIT}/{w.framework}/{straight_source(w)}/certify"
            if straight_source(w)
            else ""
        ),
    shell:
        "python {input.script} --framework {wildcards.framework} --scenario {wildcards.scenario}"
        " --script {input.example} --settings {input.settings} --cell {params.cell} {params.own}"
        " {params.straight} 2> {log}"


rule audit_matrix:
    input:
        code=code_inputs(SCRIPTS / "audit_matrix.py"),
        script=SCRIPTS / "audit_matrix.py",
        cells=expand(
            rules.audit_cell.output.cell,
            framework=config["audit"]["frameworks"],
            scenario=config["audit"]["scenarios"],
        ),
    output:
        csv=f"{AUDIT}/matrix.csv",
        summary=f"{AUDIT}/summary.md",
        plot=f"{AUDIT}/matrix.png",
        report=f"{AUDIT}/report.md",
    log:
        f"{OUT}/logs/audit/matrix.log",
    localrule: True
    conda:
        ENV
    shell:
        "python {input.script} --cells {input.cells}"
        " --csv {output.csv} --summary {output.summary} --plot {output.plot} --report {output.report} 2> {log}"


rule audit:
    input:
        rules.audit_matrix.output,


# The audit across releases (snakemake --cores 2 audit_releases; not in all): the same cells, each run in a
# venv of one release of its framework and of the packages its resume goes through (config audit_releases)
RELEASES = f"{AUDIT}/releases"
RELEASE_CELL = f"{RELEASES}/{{release}}/{{framework}}/{{scenario}}"
RELEASE_WILDCARD = "|".join(map(re.escape, RELEASE_ENVS))


rule release_env:
    input:
        code=code_inputs(SCRIPTS / "release_env.py"),
        script=SCRIPTS / "release_env.py",
    output:
        versions=f"{RELEASES}/{{release}}/versions.json",
    log:
        f"{OUT}/logs/audit/releases/{{release}}.log",
    wildcard_constraints:
        release=RELEASE_WILDCARD,
    localrule: True  # pip reaches the package index from here, not from a cluster's node
    conda:
        ENV
    params:
        requirements=lambda w: RELEASE_ENVS[w.release][1],
        env=lambda w: f"{config['audit_releases']['envs']}/{w.release}",
    shell:
        "python {input.script} --requirements '{params.requirements}' --env {params.env}"
        " --out {output.versions} 2> {log}"


use rule audit_cell as release_cell with:
    input:
        code=code_inputs(SCRIPTS / "audit_cell.py"),
        script=SCRIPTS / "audit_cell.py",
        example=audit_script,
        example_code=lambda w: code_inputs(audit_script(w)),
        settings=settings("audit"),
        release=rules.release_env.output.versions,
    output:
        cell=f"{RELEASE_CELL}/cell.json",
    log:
        f"{OUT}/logs/audit/releases/{{release}}/{{framework}}/{{scenario}}.log",
    wildcard_constraints:
        release=RELEASE_WILDCARD,
        framework="|".join(AUDIT_ROWS),
        scenario="|".join(AUDIT_SCENARIOS),
    params:
        cell=lambda w: RELEASE_CELL.format(**w),
        own=lambda w, input: f"--release {input.release}",
        straight="",  # each release's cells run their own straight runs


rule audit_releases:
    input:
        code=code_inputs(SCRIPTS / "audit_releases.py"),
        script=SCRIPTS / "audit_releases.py",
        cells=release_cells(rules.release_cell.output.cell),
    output:
        csv=f"{AUDIT}/releases.csv",
        table=f"{AUDIT}/releases.md",
        plot=f"{AUDIT}/releases.png",
    log:
        f"{OUT}/logs/audit/releases.log",
    localrule: True
    conda:
        ENV
    shell:
        "python {input.script} --cells {input.cells} --csv {output.csv} --table {output.table}"
        " --plot {output.plot} 2> {log}"
