# Every training artifact is one call of run.py: the same model, optimizer, data and loop.

RUN = SCRIPTS / "run.py"


rule straight:
    input:
        code=TRAINING_CODE,
        script=RUN,
        config=RESOLVED_CONFIG,
        tokens=TRAIN_TOKENS,
    output:
        weights=f"{OUT}/straight.pth",
        log=f"{OUT}/straight_log.csv",
    log:
        f"{OUT}/logs/straight.log",
    conda:
        ENV
    threads: config["threads"]
    shell:
        "python {input.script} --config {input.config} --tokens {input.tokens}"
        " --out {output.weights} --log {output.log} 2> {log}"


rule resume:
    input:
        code=TRAINING_CODE,
        script=RUN,
        config=RESOLVED_CONFIG,
        tokens=TRAIN_TOKENS,
    output:
        resume=f"{OUT}/resume.pth",
        log=f"{OUT}/resume_log.csv",
    log:
        f"{OUT}/logs/resume.log",
    conda:
        ENV
    threads: config["threads"]
    params:
        stop_at=config["stop_at"],
    shell:
        "python {input.script} --config {input.config} --tokens {input.tokens} --stop-at {params.stop_at}"
        " --out {output.resume} --log {output.log} 2> {log}"


rule resumed:
    input:
        code=TRAINING_CODE,
        script=RUN,
        config=RESOLVED_CONFIG,
        tokens=TRAIN_TOKENS,
        resume=rules.resume.output.resume,
    output:
        weights=f"{OUT}/resumed.pth",
        log=f"{OUT}/resumed_log.csv",
    log:
        f"{OUT}/logs/resumed.log",
    conda:
        ENV
    threads: config["threads"]
    params:
        ablation="",
    shell:
        "python {input.script} --config {input.config} --tokens {input.tokens} --resume {input.resume}"
        " {params.ablation} --out {output.weights} --log {output.log} 2> {log}"


# the two ablations: resume with one piece of the resume file thrown away


use rule resumed as noopt with:
    output:
        weights=f"{OUT}/noopt.pth",
        log=f"{OUT}/noopt_log.csv",
    log:
        f"{OUT}/logs/noopt.log",
    params:
        ablation="--no-optim",


use rule resumed as noskip with:
    output:
        weights=f"{OUT}/noskip.pth",
        log=f"{OUT}/noskip_log.csv",
    log:
        f"{OUT}/logs/noskip.log",
    params:
        ablation="--no-skip",
