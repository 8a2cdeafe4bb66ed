# Several ranks (torchrun, gloo on CPU): does a resume stay bit-exact under DDP and FSDP2, and when a run
# comes back on another number of ranks? Every job is run.py under a layout of DIST_LAYOUTS.
#
#   ddp/straight         ddp/resume ─> ddp/resumed                 (2 ranks, one resume file)
#   rank0_gen/straight   rank0_gen/resume ─> rank0_gen/resumed     (each rank its own generator)
#   fsdp2/straight       fsdp2/resume.dcp ─> fsdp2/resumed         (2 ranks, a DCP directory)
#                        ddp/resume ─> reshard_2to1                (continued on 1 rank)
#                        fsdp2/resume.dcp ─> fsdp2_to1             (DCP resharded into 1 process)
#   one_rank/resume ─> reshard_1to2, minimind_rescale              (saved on 1 rank, continued on 2)

for run, (layout, flags) in DIST_RUNS.items():

    if run != "one_rank":

        rule:
            name:
                f"dist_{run}_straight"
            input:
                code=TRAINING_CODE,
                script=RUN,
                settings=settings(f"dist_{layout}"),
                tokens=TRAIN_TOKENS,
            output:
                weights=f"{DIST}/{run}/straight.pth",
                log=f"{DIST}/{run}/straight_log.csv",
                timing=f"{DIST}/{run}/timing/straight.json",
            log:
                f"{DIST}/{run}/logs/straight.log",
            conda:
                ENV
            threads: dist_threads(layout)
            resources:
                **training_resources(DIST_LAYOUTS[layout]["world_size"]),
            params:
                launch=launch(DIST_LAYOUTS[layout]["world_size"]),
                checkpoints=checkpoint_dir,
                flags=flags,
            shell:
                DIST_SHELL

    rule:
        name:
            f"dist_{run}_resume"
        input:
            code=TRAINING_CODE,
            script=RUN,
            settings=settings(f"dist_{layout}_stop"),
            tokens=TRAIN_TOKENS,
        output:
            weights=(
                directory(dist_resume(run)) if layout == "fsdp2" else dist_resume(run)
            ),
            log=f"{DIST}/{run}/resume_log.csv",
            timing=f"{DIST}/{run}/timing/resume.json",
        log:
            f"{DIST}/{run}/logs/resume.log",
        conda:
            ENV
        threads: dist_threads(layout)
        resources:
            **training_resources(DIST_LAYOUTS[layout]["world_size"]),
        params:
            launch=launch(DIST_LAYOUTS[layout]["world_size"]),
            checkpoints=checkpoint_dir,
            flags=f"{flags} --stop-at",
        shell:
            DIST_SHELL

    if run != "one_rank":

        rule:
            name:
                f"dist_{run}_resumed"
            input:
                code=TRAINING_CODE,
                script=RUN,
                settings=settings(f"dist_{layout}"),
                tokens=TRAIN_TOKENS,
                resume=dist_resume(run),
            output:
                weights=f"{DIST}/{run}/resumed.pth",
                log=f"{DIST}/{run}/resumed_log.csv",
                timing=f"{DIST}/{run}/timing/resumed.json",
            log:
                f"{DIST}/{run}/logs/resumed.log",
            conda:
                ENV
            threads: dist_threads(layout)
            resources:
                **training_resources(DIST_LAYOUTS[layout]["world_size"]),
            params:
                launch=launch(DIST_LAYOUTS[layout]["world_size"]),
                checkpoints=checkpoint_dir,
                flags=f"{flags} --resume {dist_resume(run)}",
            shell:
                DIST_SHELL


for name, (source, layout, flags) in RESHARDS.items():

    rule:
        name:
            f"dist_{name}"
        input:
            code=TRAINING_CODE,
            script=RUN,
            settings=settings(f"dist_{layout}"),
            tokens=TRAIN_TOKENS,
            resume=dist_resume(source),
        output:
            weights=f"{DIST}/{name}.pth",
            log=f"{DIST}/{name}_log.csv",
            timing=f"{DIST}/timing/{name}.json",
        log:
            f"{DIST}/logs/{name}.log",
        conda:
            ENV
        threads: dist_threads(layout)
        resources:
            **training_resources(DIST_LAYOUTS[layout]["world_size"]),
        params:
            launch=launch(DIST_LAYOUTS[layout]["world_size"]),
            checkpoints=checkpoint_dir,
            flags=f"{flags} --resume {dist_resume(source)}",
        shell:
            DIST_SHELL


rule dist_divergence:
    input:
        code=package("config", "model", "data", "train", "checkpoint", "report"),
        script=SCRIPTS / "divergence.py",
        settings=settings("divergence"),
        val=VAL_TOKENS,
        runs=sorted(
            {
                dist_file(r, s)
                for p in DIST_PAIRS.items()
                for r in p
                for s in (".pth", "_log.csv")
            }
        ),
    output:
        csv=f"{DIST}/divergence.csv",
        md=f"{DIST}/summary.md",
    log:
        f"{DIST}/logs/divergence.log",
    conda:
        ENV
    resources:
        **ANALYSIS_RESOURCES,
    params:
        pairs=" ".join(
            f"--pair {v} {dist_file(v, '.pth')} {dist_file(v, '_log.csv')}"
            f" {r} {dist_file(r, '.pth')} {dist_file(r, '_log.csv')}"
            for v, r in DIST_PAIRS.items()
        ),
    shell:
        "python {input.script} --config {input.settings} --val {input.val}"
        " {params.pairs} --csv {output.csv} --md {output.md} 2> {log}"


# the dist/ comparisons in one target: snakemake --cores 2 dist
rule dist:
    input:
        rules.dist_divergence.output,
