# Any training command through certify (snakemake --cores 2 certify): each entry of config certify is run
# straight, SIGKILLed before the update of step stop_after + 1 (+ lose), and resumed with its resume
# arguments; OUTDIR/certify/<name>/verdict.md names the first step, rank and piece that differ.
# {outdir} in a command is OUTDIR (its files there are built first); {run} and {step} are certify's.

CERTIFY = f"{OUT}/certify"


rule certify_entry:
    input:
        code=CERTIFY_CODE + code_inputs(CERTIFY_CODE[0]),
        files=certify_files,
    output:
        verdict=f"{CERTIFY}/{{name}}/verdict.md",
        json=f"{CERTIFY}/{{name}}/verdict.json",
    log:
        f"{OUT}/logs/certify/{{name}}.log",
    wildcard_constraints:
        name="|".join(config["certify"]) or "^$",
    conda:
        ENV
    threads: lambda w: 2 if "torchrun" in certify_command(w.name) else 1
    params:
        folder=lambda w: f"{CERTIFY}/{w.name}",
        stop_after=lambda w: config["certify"][w.name]["stop_after"],
        lose=lambda w: config["certify"][w.name].get("lose", 0),
        resume=lambda w: shlex.quote(config["certify"][w.name].get("resume", "")),
        command=lambda w: certify_command(w.name),
    shell:
        # exit 1 is a verdict (not exact), as much a result as 0
        "certify --out {params.folder} --stop-after {params.stop_after} --lose {params.lose}"
        " --resume {params.resume} -- {params.command} > {log} 2>&1 || [ $? -eq 1 ]"


rule certify_report:
    input:
        script=SCRIPTS / "certify_report.py",
        verdicts=expand(rules.certify_entry.output.json, name=list(config["certify"])),
    output:
        report=f"{CERTIFY}/report.md",
        summary=f"{CERTIFY}/summary.md",
    log:
        f"{OUT}/logs/certify/report.log",
    localrule: True
    conda:
        ENV
    shell:
        "python {input.script} --verdicts {input.verdicts}"
        " --report {output.report} --summary {output.summary} 2> {log}"


rule certify:
    input:
        rules.certify_report.output,
