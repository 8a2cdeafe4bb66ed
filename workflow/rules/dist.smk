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
# continued on another number of ranks: (resume of, layout, flags); MiniMind's rescale is an ablation's
RESCALE = ABLATIONS["minimind_rescale"]
RESHARDS = {
    "reshard_2to1": ("ddp", "one_rank", "--reshard"),
    "reshard_1to2": ("one_rank", "ddp", "--reshard"),
    RESCALE.job: ("one_rank", "ddp", f"--reshard {RESCALE.flag}"),
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


# each run as TRAINING_JOBS (train.smk), which training.smk makes rules
for run, (layout, flags) in DIST_RUNS.items():
    ranks = DIST_LAYOUTS[layout]["world_size"]
    folder = f"{DIST}/{run}"
    if run != "one_rank":
        TRAINING_JOBS[f"dist_{run}_straight"] = TrainingJob(
            folder, "straight", f"dist_{layout}", ranks, flags
        )
    TRAINING_JOBS[f"dist_{run}_resume"] = TrainingJob(
        folder,
        "resume",
        f"dist_{layout}_stop",
        ranks,
        f"{flags} --stop-at".strip(),
        out=DIST_RESUME[run],
    )
    if run != "one_rank":
        TRAINING_JOBS[f"dist_{run}_resumed"] = TrainingJob(
            folder, "resumed", f"dist_{layout}", ranks, flags, DIST_RESUME[run]
        )
for name, (source, layout, flags) in RESHARDS.items():
    TRAINING_JOBS[f"dist_{name}"] = TrainingJob(
        DIST,
        name,
        f"dist_{layout}",
        DIST_LAYOUTS[layout]["world_size"],
        flags,
        DIST_RESUME[source],
    )


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
