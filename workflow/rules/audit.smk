# The audit of other trainers (snakemake --cores 2 audit): for each framework and scenario of config audit,
# three processes through the framework's own documented resume: straight, stopped right after its own
# checkpoint at the cut, resumed from it. A cell compares them step by step (certificates) and, where they
# differ, runs a repair that restores the named piece by hand; a negative control per framework.

AUDIT = f"{OUT}/audit"
CELL = f"{AUDIT}/{{framework}}/{{scenario}}"
AUDIT_WILDCARDS = dict(
    framework="|".join(config["audit"]["frameworks"]),
    scenario="|".join(config["audit"]["scenarios"]),
)
CONTROL_SCENARIO = "mid_epoch"


# the framework's checkpoints of a straight or resumed run are scratch: only the stopped run's are kept
ADAPTER_SHELL = (
    "scratch=$(mktemp -d) && trap 'rm -rf $scratch' EXIT &&"
    " python {input.script} --settings {input.settings} --tokens {input.tokens}"
    " --scenario {wildcards.scenario} --certificate {output.certificate} {params.recipe}"
    " {params.mode} 2> {log}"
)


rule audit_straight:
    input:
        code=adapter_code,
        script=adapter,
        settings=settings("audit"),
        tokens=TRAIN_TOKENS,
    output:
        certificate=f"{CELL}/straight/certificate.jsonl",
        weights=f"{CELL}/straight/weights.pt",
        cut_state=f"{CELL}/straight/cut_state.pt",
    log:
        f"{OUT}/logs/audit/{{framework}}/{{scenario}}/straight.log",
    wildcard_constraints:
        **AUDIT_WILDCARDS,
    conda:
        ENV
    params:
        recipe=recipe_flags,
        mode=lambda w, output: f"--mode straight --checkpoints $scratch --weights {output.weights}"
        f" --cut-state {output.cut_state}",
    shell:
        ADAPTER_SHELL


rule audit_stop:
    input:
        code=adapter_code,
        script=adapter,
        settings=settings("audit"),
        tokens=TRAIN_TOKENS,
    output:
        certificate=f"{CELL}/stopped/certificate.jsonl",
        checkpoints=directory(f"{CELL}/stopped/checkpoints"),
    log:
        f"{OUT}/logs/audit/{{framework}}/{{scenario}}/stopped.log",
    wildcard_constraints:
        **AUDIT_WILDCARDS,
    conda:
        ENV
    params:
        recipe=recipe_flags,
        mode=lambda w, output: f"--mode stop --checkpoints {output.checkpoints}",
    shell:
        ADAPTER_SHELL


rule audit_resumed:
    input:
        code=adapter_code,
        script=adapter,
        settings=settings("audit"),
        tokens=TRAIN_TOKENS,
        checkpoints=rules.audit_stop.output.checkpoints,
    output:
        certificate=f"{CELL}/resumed/certificate.jsonl",
        weights=f"{CELL}/resumed/weights.pt",
    log:
        f"{OUT}/logs/audit/{{framework}}/{{scenario}}/resumed.log",
    wildcard_constraints:
        **AUDIT_WILDCARDS,
    conda:
        ENV
    params:
        recipe=recipe_flags,
        mode=lambda w, input, output: f"--mode resumed --checkpoints $scratch/resumed"
        f" --resume-from {input.checkpoints} --weights {output.weights}",
    shell:
        ADAPTER_SHELL


rule audit_cell:
    input:
        code=code_inputs(SCRIPTS / "audit_cell.py"),
        adapter_code=adapter_code,
        script=SCRIPTS / "audit_cell.py",
        adapter=adapter,
        settings=settings("audit"),
        tokens=TRAIN_TOKENS,
        straight=rules.audit_straight.output,
        stopped=rules.audit_stop.output,
        resumed=rules.audit_resumed.output,
    output:
        f"{CELL}/cell.json",
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
        " --straight {params.cell}/straight --stopped {params.cell}/stopped --resumed {params.cell}/resumed"
        " --out {output} 2> {log}"


rule audit_control:
    input:
        code=code_inputs(SCRIPTS / "audit_control.py"),
        adapter_code=adapter_code,
        script=SCRIPTS / "audit_control.py",
        adapter=adapter,
        settings=settings("audit"),
        tokens=TRAIN_TOKENS,
        straight=expand(
            rules.audit_straight.output, scenario=CONTROL_SCENARIO, allow_missing=True
        ),
        stopped=expand(
            rules.audit_stop.output, scenario=CONTROL_SCENARIO, allow_missing=True
        ),
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
        " --straight {params.cell}/straight --stopped {params.cell}/stopped --cell {input.cell}"
        " --out {output.json} --certificate {output.certificate} 2> {log}"


rule audit_matrix:
    input:
        code=code_inputs(SCRIPTS / "audit_matrix.py"),
        script=SCRIPTS / "audit_matrix.py",
        cells=expand(
            rules.audit_cell.output,
            framework=config["audit"]["frameworks"],
            scenario=config["audit"]["scenarios"],
        ),
        controls=expand(
            rules.audit_control.output.json, framework=config["audit"]["frameworks"]
        ),
        # what fp16 really trained in: its straight weights against the fp32 and bf16 runs'
        straight=expand(
            rules.audit_straight.output.weights,
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
        "python {input.script} --cells {input.cells} --controls {input.controls}"
        " --csv {output.csv} --summary {output.summary} --plot {output.plot} --report {output.report} 2> {log}"


rule audit:
    input:
        rules.audit_matrix.output,
