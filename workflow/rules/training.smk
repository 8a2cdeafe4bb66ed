# Every training job (TRAINING_JOBS: train.smk's, then dist.smk's) as a rule, all with this one body.
# (a rule's shell string is evaluated when its job runs, after the loop has moved on: what differs per
# job goes into params, which are bound when the rule is defined)


for name, job in TRAINING_JOBS.items():
    job_weights = job.out or f"{job.folder}/{job.stem}.pth"
    job_arguments = " ".join(
        filter(None, [job.flags, job.resume and f"--resume {job.resume}"])
    )

    rule:
        name:
            name
        input:
            **TRAIN_DATA,
            **({"resume": job.resume} if job.resume else {}),
            code=training_code(job.ranks),
            script=RUN,
            settings=settings(job.settings),
        output:
            weights=(
                directory(job_weights) if job_weights.endswith(".dcp") else job_weights
            ),
            log=f"{job.folder}/{job.stem}_log.csv",
            timing=f"{job.folder}/timing/{job.stem}.json",
        log:
            f"{job.folder}/logs/{job.stem}.log",
        conda:
            ENV
        threads: config["threads"] * job.ranks
        resources:
            **training_resources(job.ranks),
        params:
            launch=launch(job.ranks),
            checkpoints=checkpoint_dir,
            flags=job_arguments,
        shell:
            "{params.launch} {input.script} --config {input.settings}"
            f" {TRAIN_DATA_ARGS} {{params.flags}} --out {{output.weights}} --loss-log {{output.log}}"
            " --timing {output.timing} --checkpoint-dir {params.checkpoints} 2> {log}"
