# The audit of other trainers (snakemake --cores 2 audit): for each framework and scenario of config audit,
# three processes through the framework's own documented resume: straight, stopped right after its own
# checkpoint at the cut, resumed from it. A cell compares them step by step (certificates) and, where they
# differ, runs a repair that restores the named piece by hand (the straight weights also tell the matrix what
# fp16 trained in); a negative control per framework.

AUDIT = f"{OUT}/audit"
CELL = f"{AUDIT}/{{framework}}/{{scenario}}"
AUDIT_WILDCARDS = dict(
    framework="|".join(config["audit"]["frameworks"]),
    scenario="|".join(config["audit"]["scenarios"]),
)
CONTROL_SCENARIO = "mid_epoch"


# a cell is one job: its process imports the framework once and forks each run from it (mmkit.audit.Runs), so
# that the imports, most of a run's time, are paid once per cell
rule audit_cell:
    input:
        code=code_inputs(SCRIPTS / "audit_cell.py"),
        adapter_code=adapter_code,
        script=SCRIPTS / "audit_cell.py",
        adapter=adapter,
        settings=settings("audit"),
        tokens=TRAIN_TOKENS,
    output:
        straight=multiext(
            f"{CELL}/straight/", "certificate.jsonl", "weights.pt", "cut_state.pt"
        ),
        stopped=f"{CELL}/stopped/certificate.jsonl",
        checkpoints=directory(f"{CELL}/stopped/checkpoints"),
        resumed=multiext(f"{CELL}/resumed/", "certificate.jsonl", "weights.pt"),
        cell=f"{CELL}/cell.json",
    log:
        f"{OUT}/logs/audit/{{framework}}/{{scenario}}/cell.log",
    wildcard_constraints:
        **AUDIT_WILDCARDS,
    conda:
        ENV
    params:
        cell=lambda w: f"{AUDIT}/{w.framework}/{w.scenario}",
    shell:
        "python {input.script} --framework {wildcards.framework} --scenario {wildcards.scenario}"
        " --adapter {input.adapter} --settings {input.settings} --tokens {input.tokens}"
        " --cell {params.cell} --out {output.cell} 2> {log}"


rule audit_control:
    input:
        code=code_inputs(SCRIPTS / "audit_control.py"),
        adapter_code=adapter_code,
        script=SCRIPTS / "audit_control.py",
        adapter=adapter,
        settings=settings("audit"),
        tokens=TRAIN_TOKENS,
        cell=expand(
            rules.audit_cell.output, scenario=CONTROL_SCENARIO, allow_missing=True
        ),
    output:
        json=f"{AUDIT}/{{framework}}/control.json",
        certificate=f"{AUDIT}/{{framework}}/control.jsonl",
    log:
        f"{OUT}/logs/audit/{{framework}}/control.log",
    wildcard_constraints:
        framework=AUDIT_WILDCARDS["framework"],
    conda:
        ENV
    params:
        cell=lambda w: f"{AUDIT}/{w.framework}/{CONTROL_SCENARIO}",
        scenario=CONTROL_SCENARIO,
    shell:
        "python {input.script} --framework {wildcards.framework} --scenario {params.scenario}"
        " --adapter {input.adapter} --settings {input.settings} --tokens {input.tokens}"
        " --cell {params.cell} --out {output.json} --certificate {output.certificate} 2> {log}"


rule audit_matrix:
    input:
        code=code_inputs(SCRIPTS / "audit_matrix.py"),
        script=SCRIPTS / "audit_matrix.py",
        cells=expand(
            rules.audit_cell.output.cell,
            framework=config["audit"]["frameworks"],
            scenario=config["audit"]["scenarios"],
        ),
        controls=expand(
            rules.audit_control.output.json, framework=config["audit"]["frameworks"]
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
        "python {input.script} --cells {input.cells} --controls {input.controls}"
        " --csv {output.csv} --summary {output.summary} --plot {output.plot} --report {output.report} 2> {log}"


rule audit:
    input:
        rules.audit_matrix.output,
