# The audit of other trainers (snakemake --cores 2 audit): for each framework and scenario of config audit, a
# certify run of the framework's example script (examples/; own: this project's run.py) with the scenario's
# flags: straight, SIGKILLed after its own checkpoint at the cut, resumed through its own documented resume;
# where they differ, repairs that put the named piece back by hand, and in the mid-epoch cell a negative control.

AUDIT = f"{OUT}/audit"
CELL = f"{AUDIT}/{{framework}}/{{scenario}}"
AUDIT_WILDCARDS = dict(
    framework="|".join(config["audit"]["frameworks"]),
    scenario="|".join(config["audit"]["scenarios"]),
)


rule audit_cell:
    input:
        unpack(own_inputs),
        code=code_inputs(SCRIPTS / "audit_cell.py"),
        script=SCRIPTS / "audit_cell.py",
        example=audit_script,
        example_code=lambda w: code_inputs(audit_script(w)),
        settings=settings("audit"),
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
    shell:
        "python {input.script} --framework {wildcards.framework} --scenario {wildcards.scenario}"
        " --script {input.example} --settings {input.settings} --cell {params.cell} {params.own} 2> {log}"


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
