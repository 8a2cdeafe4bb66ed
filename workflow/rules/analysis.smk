# What the runs mean: half-precision weights, what the resume file weighs, how far variants drift.


rule fp16:
    input:
        code=code_inputs(SCRIPTS / "half_precision.py"),
        script=SCRIPTS / "half_precision.py",
        settings=settings("fp16"),
        weights=rules.straight.output.weights,
        val=VAL_TOKENS,
    output:
        weights=f"{OUT}/straight_fp16.pth",
        json=f"{OUT}/fp16.json",
    log:
        f"{OUT}/logs/fp16.log",
    conda:
        ENV
    resources:
        **ANALYSIS_RESOURCES,
    params:
        dtype="fp16",
    shell:
        "python {input.script} --config {input.settings} --weights {input.weights} --val {input.val}"
        " --dtype {params.dtype} --out {output.weights} --json {output.json} 2> {log}"


use rule fp16 as bf16 with:
    output:
        weights=f"{OUT}/straight_bf16.pth",
        json=f"{OUT}/bf16.json",
    log:
        f"{OUT}/logs/bf16.log",
    params:
        dtype="bf16",


rule inference:
    input:
        code=code_inputs(SCRIPTS / "export_inference.py"),
        script=SCRIPTS / "export_inference.py",
        settings=settings("inference"),
        weights=rules.straight.output.weights,
    output:
        safetensors=f"{OUT}/inference/model.safetensors",
        config=f"{OUT}/inference/config.json",
    log:
        f"{OUT}/logs/inference.log",
    conda:
        ENV
    resources:
        **ANALYSIS_RESOURCES,
    params:
        outdir=lambda w, output: os.path.dirname(output.config),
    shell:
        "python {input.script} --config {input.settings} --weights {input.weights}"
        " --outdir {params.outdir} 2> {log}"


rule optim:
    input:
        code=code_inputs(SCRIPTS / "optim_counts.py"),
        script=SCRIPTS / "optim_counts.py",
        resume=rules.resume.output.weights,
    output:
        json=f"{OUT}/optim.json",
        entries=f"{OUT}/resume_entries.md",  # docs/checkpoints.md's table of entries
    log:
        f"{OUT}/logs/optim.log",
    conda:
        ENV
    resources:
        **ANALYSIS_RESOURCES,
    shell:
        "python {input.script} --resume {input.resume} --json {output.json}"
        " --entries {output.entries} 2> {log}"


# every resumed variant, compared with the straight run (resumed is the control); the new paths' ablations
# where their path is on: the epoch replayed (minimind format), the RNG (dropout), the GradScaler (fp16)
VARIANTS = (
    ["resumed", "noopt", "noskip", "nosched", "halfresume"]
    + ["replay"] * (not WINDOWS)
    + ["norng"] * (config["model"]["dropout"] > 0)
    + ["noscaler"] * (config["precision"] == "fp16")
)
TRAINING_RUNS = ["straight", "resume"] + VARIANTS


rule divergence:
    input:
        code=code_inputs(SCRIPTS / "divergence.py"),
        script=SCRIPTS / "divergence.py",
        settings=settings("divergence"),
        val=VAL_TOKENS,
        straight=rules.straight.output.weights,
        straight_log=rules.straight.output.log,
        variants=expand(
            "{out}/{variant}{suffix}",
            out=OUT,
            variant=VARIANTS,
            suffix=[".pth", "_log.csv"],
        ),
    output:
        report(
            f"{OUT}/divergence.csv",
            caption="../report/divergence.rst",
            category="Divergence",
        ),
    log:
        f"{OUT}/logs/divergence.log",
    conda:
        ENV
    resources:
        **ANALYSIS_RESOURCES,
    params:
        variants=" ".join(
            f"--variant {v} {OUT}/{v}.pth {OUT}/{v}_log.csv" for v in VARIANTS
        ),
    shell:
        "python {input.script} --config {input.settings} --val {input.val}"
        " --straight {input.straight} {input.straight_log} {params.variants} --csv {output} 2> {log}"


rule plots:
    input:
        code=code_inputs(SCRIPTS / "plots.py"),
        script=SCRIPTS / "plots.py",
        logs=expand("{out}/{run}_log.csv", out=OUT, run=TRAINING_RUNS),
    output:
        loss=report(
            f"{OUT}/plots/loss.png", caption="../report/loss.rst", category="Plots"
        ),
        gap=report(
            f"{OUT}/plots/loss_gap.png",
            caption="../report/loss_gap.rst",
            category="Plots",
        ),
    log:
        f"{OUT}/logs/plots.log",
    conda:
        ENV
    resources:
        **ANALYSIS_RESOURCES,
    shell:
        "python {input.script} --logs {input.logs}"
        " --loss {output.loss} --gap {output.gap} 2> {log}"


rule report:
    input:
        code=code_inputs(SCRIPTS / "report.py"),
        script=SCRIPTS / "report.py",
        resume=rules.resume.output.weights,
        divergence=rules.divergence.output,
        fp16=rules.fp16.output.json,
        bf16=rules.bf16.output.json,
        optim=rules.optim.output.json,
        entries=rules.optim.output.entries,
        straight_log=rules.straight.output.log,
        resumed_log=rules.resumed.output.log,
        plots=rules.plots.output,
        timing=expand("{out}/timing/{run}.json", out=OUT, run=TRAINING_RUNS),
        dist=rules.dist_divergence.output.csv if DIST_IN_ALL else [],
    output:
        report=report(
            f"{OUT}/report.md", caption="../report/report.rst", category="Report"
        ),
        summary=f"{OUT}/summary.md",
    log:
        f"{OUT}/logs/report.log",
    conda:
        ENV
    resources:
        **ANALYSIS_RESOURCES,
    params:
        dist=lambda w, input: f"--dist {input.dist}" if input.dist else "",
    shell:
        "python {input.script} --resume {input.resume}"
        " --divergence {input.divergence} --fp16 {input.fp16} --bf16 {input.bf16} --optim {input.optim}"
        " --entries {input.entries}"
        " --straight-log {input.straight_log} --resumed-log {input.resumed_log}"
        " --plots {input.plots} --timing {input.timing} {params.dist}"
        " --out {output.report} --summary {output.summary} 2> {log}"
