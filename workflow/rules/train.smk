# Every training artifact is one call of run.py: the same model, optimizer, data and loop.

RUN = SCRIPTS / "run.py"


# straight, resume and resumed (and its ablations) differ only in params, bound when each rule is defined:
# the shell string is filled in when the job runs. flags: to the end, --stop-at (save the resume file
# after stop_at steps), or --resume from one; ablation: the piece of the resume file thrown away or
# damaged. --out is the output named weights: the weights, or the resume file (as in dist.smk).
TRAIN_SHELL = (
    f"{launch(config['parallel']['world_size'])} {{input.script}} --config {{input.settings}}"
    f" {TRAIN_DATA_ARGS} {{params.flags}} {{params.ablation}} --out {{output.weights}}"
    " --loss-log {output.log} --timing {output.timing} --checkpoint-dir {params.checkpoints} 2> {log}"
)


rule straight:
    input:
        **TRAIN_DATA,
        code=training_code(config["parallel"]["world_size"]),
        script=RUN,
        settings=settings("straight"),
    output:
        weights=f"{OUT}/straight.pth",
        log=f"{OUT}/straight_log.csv",
        timing=f"{OUT}/timing/straight.json",
    log:
        f"{OUT}/logs/straight.log",
    conda:
        ENV
    threads: config["threads"] * config["parallel"]["world_size"]
    resources:
        **TRAINING_RESOURCES,
    params:
        checkpoints=checkpoint_dir,
        flags="",
        ablation="",
    shell:
        TRAIN_SHELL


rule resume:
    input:
        **TRAIN_DATA,
        code=training_code(config["parallel"]["world_size"]),
        script=RUN,
        settings=settings("resume"),
    output:
        weights=f"{OUT}/resume.pth",  # the resume file: the weights and all a resume needs besides
        log=f"{OUT}/resume_log.csv",
        timing=f"{OUT}/timing/resume.json",
    log:
        f"{OUT}/logs/resume.log",
    conda:
        ENV
    threads: config["threads"] * config["parallel"]["world_size"]
    resources:
        **TRAINING_RESOURCES,
    params:
        checkpoints=checkpoint_dir,
        flags="--stop-at",
        ablation="",
    shell:
        TRAIN_SHELL


rule resumed:
    input:
        **TRAIN_DATA,
        code=training_code(config["parallel"]["world_size"]),
        script=RUN,
        settings=settings("resumed"),
        resume=rules.resume.output.weights,
    output:
        weights=f"{OUT}/resumed.pth",
        log=f"{OUT}/resumed_log.csv",
        timing=f"{OUT}/timing/resumed.json",
    log:
        f"{OUT}/logs/resumed.log",
    conda:
        ENV
    threads: config["threads"] * config["parallel"]["world_size"]
    resources:
        **TRAINING_RESOURCES,
    params:
        checkpoints=checkpoint_dir,
        flags=lambda w, input: f"--resume {input.resume}",
        ablation="",
    shell:
        TRAIN_SHELL


# The ablations: resume with one piece of the resume file thrown away or damaged.


use rule resumed as noopt with:
    output:
        weights=f"{OUT}/noopt.pth",
        log=f"{OUT}/noopt_log.csv",
        timing=f"{OUT}/timing/noopt.json",
    log:
        f"{OUT}/logs/noopt.log",
    params:
        ablation="--no-optim",


use rule resumed as noskip with:
    output:
        weights=f"{OUT}/noskip.pth",
        log=f"{OUT}/noskip_log.csv",
        timing=f"{OUT}/timing/noskip.json",
    log:
        f"{OUT}/logs/noskip.log",
    params:
        ablation="--no-skip",


use rule resumed as nosched with:
    output:
        weights=f"{OUT}/nosched.pth",
        log=f"{OUT}/nosched_log.csv",
        timing=f"{OUT}/timing/nosched.json",
    log:
        f"{OUT}/logs/nosched.log",
    params:
        ablation="--restart-schedule",


rule resume_fp16:
    input:
        code=code_inputs(SCRIPTS / "halve_resume.py"),
        script=SCRIPTS / "halve_resume.py",
        resume=rules.resume.output.weights,
    output:
        f"{OUT}/resume_fp16.pth",
    log:
        f"{OUT}/logs/resume_fp16.log",
    conda:
        ENV
    resources:
        **ANALYSIS_RESOURCES,
    shell:
        "python {input.script} --resume {input.resume} --out {output} 2> {log}"


use rule resumed as halfresume with:
    input:
        **TRAIN_DATA,
        code=training_code(config["parallel"]["world_size"]),
        script=RUN,
        settings=settings("resumed"),
        resume=rules.resume_fp16.output,
    output:
        weights=f"{OUT}/halfresume.pth",
        log=f"{OUT}/halfresume_log.csv",
        timing=f"{OUT}/timing/halfresume.json",
    log:
        f"{OUT}/logs/halfresume.log",
    params:
        ablation="--allow-mismatch",  # its fingerprint says fp16 weights: resumed on purpose, not bit-exact


# The new paths' ablations, built where their path is on (analysis.smk: VARIANTS)


use rule resumed as replay with:
    output:
        weights=f"{OUT}/replay.pth",
        log=f"{OUT}/replay_log.csv",
        timing=f"{OUT}/timing/replay.json",
    log:
        f"{OUT}/logs/replay.log",
    params:
        ablation="--replay",  # minimind format: the epoch again from its first batch


use rule resumed as norng with:
    output:
        weights=f"{OUT}/norng.pth",
        log=f"{OUT}/norng_log.csv",
        timing=f"{OUT}/timing/norng.json",
    log:
        f"{OUT}/logs/norng.log",
    params:
        ablation="--no-rng",  # dropout > 0: the masks drawn again from the fresh run's RNG


use rule resumed as noscaler with:
    output:
        weights=f"{OUT}/noscaler.pth",
        log=f"{OUT}/noscaler_log.csv",
        timing=f"{OUT}/timing/noscaler.json",
    log:
        f"{OUT}/logs/noscaler.log",
    params:
        ablation="--no-scaler",  # fp16: a fresh GradScaler, its scale back at 65536
