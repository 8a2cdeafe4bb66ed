# Several ranks (torchrun, gloo on CPU): does a resume stay bit-exact under DDP and FSDP2, and when a run
# comes back on another number of ranks? Every job is run.py under a layout of DIST_LAYOUTS.
#
#   ddp/straight         ddp/resume ─> ddp/resumed                 (2 ranks, one resume file)
#   rank0_gen/straight   rank0_gen/resume ─> rank0_gen/resumed     (each rank its own generator)
#   fsdp2/straight       fsdp2/resume.dcp ─> fsdp2/resumed         (2 ranks, a DCP directory)
#                        ddp/resume ─> reshard_2to1                (continued on 1 rank)
#                        fsdp2/resume.dcp ─> fsdp2_to1             (DCP resharded into 1 process)
#   one_rank/resume ─> reshard_1to2, minimind_rescale              (saved on 1 rank, continued on 2)

DIST = f"{OUT}/dist"
DIST_IN_ALL = config["dist"] or config["parallel"]["world_size"] > 1
if not WINDOWS and config["dist"]:
    raise WorkflowError(
        "config key 'dist': the dist/ runs train on several ranks, which data.format minimind does not"
        " (an epoch's short last batch cannot be cut into equal rank slices); set dist: false"
    )

# The rank layouts it compares, each laid over the config's parallel section. batch_slices is 2 in
# the first three, so the global batch is summed in the same order whether 1 or 2 ranks train it;
# one_slice takes the whole batch at once, the resharding that cannot be bit-exact.
DIST_LAYOUTS = {
    "ddp": {"world_size": 2, "strategy": "ddp", "batch_slices": 2},
    "fsdp2": {"world_size": 2, "strategy": "fsdp2", "batch_slices": 2},
    "one_rank": {"world_size": 1, "strategy": "ddp", "batch_slices": 2},
    "one_slice": {"world_size": 1, "strategy": "ddp", "batch_slices": 1},
}
for layout in DIST_LAYOUTS:
    READS[f"dist_{layout}"] = TRAINING
    READS[f"dist_{layout}_stop"] = TRAINING + ["stop_at"]
    LAYOUTS[f"dist_{layout}"] = LAYOUTS[f"dist_{layout}_stop"] = DIST_LAYOUTS[layout]
# run: (layout, flags)
DIST_RUNS = {
    "ddp": ("ddp", ""),
    "rank0_gen": ("ddp", "--rank-generators"),
    "fsdp2": ("fsdp2", ""),
    "one_rank": ("one_rank", ""),
}
# continued on another number of ranks: (resume of, layout, flags)
RESHARDS = {
    "reshard_2to1": ("ddp", "one_rank", "--reshard"),
    "reshard_1to2": ("one_rank", "ddp", "--reshard"),
    "minimind_rescale": ("one_rank", "ddp", "--reshard --minimind-rescale"),
    "fsdp2_to1": ("fsdp2", "one_rank", "--reshard"),
    "reshard_2to1_one_slice": ("ddp", "one_slice", "--reshard"),
}
# each compared with the run it should equal: variant: reference
DIST_PAIRS = {
    "ddp/resumed": "ddp/straight",
    "rank0_gen/resumed": "rank0_gen/straight",
    "fsdp2/resumed": "fsdp2/straight",
    "fsdp2/straight": "ddp/straight",
    "reshard_2to1": "ddp/straight",
    "reshard_1to2": "ddp/straight",
    "minimind_rescale": "ddp/straight",
    "fsdp2_to1": "fsdp2/straight",
    "reshard_2to1_one_slice": "ddp/straight",
}


# each run's resume: a DCP directory under FSDP2, one file under DDP
DIST_RESUME = {
    run: f"{DIST}/{run}/resume.dcp" if layout == "fsdp2" else f"{DIST}/{run}/resume.pth"
    for run, (layout, _) in DIST_RUNS.items()
}


# (a rule's shell string is evaluated when its job runs, after the loops below have moved on: what
# differs per rule goes into params, which are bound when the rule is defined)
DIST_SHELL = (
    "{params.launch} {input.script} --config {input.settings} --tokens {input.tokens} {params.flags}"
    " --out {output.weights} --loss-log {output.log} --timing {output.timing}"
    " --checkpoint-dir {params.checkpoints} 2> {log}"
)


for run, (layout, flags) in DIST_RUNS.items():
    ranks = DIST_LAYOUTS[layout]["world_size"]

    if run != "one_rank":

        rule:
            name:
                f"dist_{run}_straight"
            input:
                code=training_code(ranks),
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
            threads: config["threads"] * ranks
            resources:
                **training_resources(ranks),
            params:
                launch=launch(ranks),
                checkpoints=checkpoint_dir,
                flags=flags,
            shell:
                DIST_SHELL

    rule:
        name:
            f"dist_{run}_resume"
        input:
            code=training_code(ranks),
            script=RUN,
            settings=settings(f"dist_{layout}_stop"),
            tokens=TRAIN_TOKENS,
        output:
            weights=(
                directory(DIST_RESUME[run]) if layout == "fsdp2" else DIST_RESUME[run]
            ),
            log=f"{DIST}/{run}/resume_log.csv",
            timing=f"{DIST}/{run}/timing/resume.json",
        log:
            f"{DIST}/{run}/logs/resume.log",
        conda:
            ENV
        threads: config["threads"] * ranks
        resources:
            **training_resources(ranks),
        params:
            launch=launch(ranks),
            checkpoints=checkpoint_dir,
            flags=f"{flags} --stop-at",
        shell:
            DIST_SHELL

    if run != "one_rank":

        rule:
            name:
                f"dist_{run}_resumed"
            input:
                code=training_code(ranks),
                script=RUN,
                settings=settings(f"dist_{layout}"),
                tokens=TRAIN_TOKENS,
                resume=DIST_RESUME[run],
            output:
                weights=f"{DIST}/{run}/resumed.pth",
                log=f"{DIST}/{run}/resumed_log.csv",
                timing=f"{DIST}/{run}/timing/resumed.json",
            log:
                f"{DIST}/{run}/logs/resumed.log",
            conda:
                ENV
            threads: config["threads"] * ranks
            resources:
                **training_resources(ranks),
            params:
                launch=launch(ranks),
                checkpoints=checkpoint_dir,
                flags=f"{flags} --resume {DIST_RESUME[run]}",
            shell:
                DIST_SHELL


for name, (source, layout, flags) in RESHARDS.items():
    ranks = DIST_LAYOUTS[layout]["world_size"]

    rule:
        name:
            f"dist_{name}"
        input:
            code=training_code(ranks),
            script=RUN,
            settings=settings(f"dist_{layout}"),
            tokens=TRAIN_TOKENS,
            resume=DIST_RESUME[source],
        output:
            weights=f"{DIST}/{name}.pth",
            log=f"{DIST}/{name}_log.csv",
            timing=f"{DIST}/timing/{name}.json",
        log:
            f"{DIST}/logs/{name}.log",
        conda:
            ENV
        threads: config["threads"] * ranks
        resources:
            **training_resources(ranks),
        params:
            launch=launch(ranks),
            checkpoints=checkpoint_dir,
            flags=f"{flags} --resume {DIST_RESUME[source]}",
        shell:
            DIST_SHELL


rule dist_divergence:
    input:
        code=code_inputs(SCRIPTS / "divergence.py"),
        script=SCRIPTS / "divergence.py",
        settings=settings("divergence"),
        val=VAL_TOKENS,
        runs=sorted(
            {
                f"{DIST}/{r}{s}"
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
            f"--pair {v} {DIST}/{v}.pth {DIST}/{v}_log.csv {r} {DIST}/{r}.pth {DIST}/{r}_log.csv"
            for v, r in DIST_PAIRS.items()
        ),
    shell:
        "python {input.script} --config {input.settings} --val {input.val}"
        " {params.pairs} --csv {output.csv} --md {output.md} 2> {log}"


# the dist/ comparisons in one target: snakemake --cores 2 dist
rule dist:
    input:
        rules.dist_divergence.output,
