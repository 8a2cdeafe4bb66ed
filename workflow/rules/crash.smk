# What a power loss can leave of a save: each save's file operations recorded, every crash state they allow
# continued from (workflow/scripts/crash_states.py). Not part of `all`: snakemake --cores 2 crash.

CRASH = SCRIPTS / "crash_states.py"
CRASH_CONTROLS = [
    "no-dir-fsync",
    "no-file-fsync",
    "no-fsync",
]  # the protocol broken on purpose: each must fail states, for its own reason


rule crash_control:
    input:
        code=code_inputs(CRASH),
        script=CRASH,
    output:
        md=f"{OUT}/crash/control_{{control}}.md",
        csv=f"{OUT}/crash/control_{{control}}.csv",
    log:
        f"{OUT}/logs/crash_control_{{control}}.log",
    wildcard_constraints:
        control="|".join(CRASH_CONTROLS),
    conda:
        ENV
    resources:
        **ANALYSIS_RESOURCES,
    shell:
        "python {input.script} --control {wildcards.control} --out-md {output.md} --out-csv {output.csv}"
        " 2> {log}"


rule crash_states:
    input:
        code=code_inputs(CRASH),
        script=CRASH,
        controls=expand(rules.crash_control.output.csv, control=CRASH_CONTROLS),
    output:
        md=f"{OUT}/crash/states.md",
        csv=f"{OUT}/crash/states.csv",
    log:
        f"{OUT}/logs/crash_states.log",
    conda:
        ENV
    resources:
        **ANALYSIS_RESOURCES,
    shell:
        "python {input.script} --controls {input.controls} --out-md {output.md} --out-csv {output.csv}"
        " 2> {log}"


rule crash:
    input:
        rules.crash_states.output,
