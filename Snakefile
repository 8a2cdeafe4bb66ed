# Does a run stopped at step stop_at and resumed from its resume file end bit-for-bit where the
# straight run ends? And what changes when the resume file forgets the optimizer or the data position?
#
#   tokenize ─> straight ──────────────> fp16, bf16, inference ──┐
#      └──────> resume ─> resumed ─────┐                          │
#                  ├────> noopt ───────┤                          │
#                  ├────> noskip ──────┼─> divergence, plots ─────┼─> report
#                  ├────> nosched ─────┤                          │
#                  ├────> resume_fp16 ─> halfresume               │
#                  └────> optim ──────────────────────────────────┘
#
# And with several ranks (snakemake --cores 2 dist; part of all with dist: true): the same cut under
# torchrun, DDP and FSDP2, and continued on another number of ranks, in OUTDIR/dist/ (rules/dist.smk).
#
# Each job reads only the config keys its rule declares (READS in workflow/rules/config.smk), from
# OUTDIR/settings/<rule>.yaml: a changed setting reruns exactly the jobs that read it, and what follows.

from snakemake.utils import min_version

min_version("8.0")


configfile: "config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/config.smk"  # the config checked, data paths, what each rule reads (READS)
include: "workflow/rules/code.smk"  # the modules each script imports (its code inputs); launch
include: "workflow/rules/resources.smk"  # what each job asks a cluster for
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/dist.smk"
include: "workflow/rules/training.smk"  # train.smk's and dist.smk's training jobs: one rule body
include: "workflow/rules/analysis.smk"
include: "workflow/rules/audit.smk"  # other trainers' resume: snakemake --cores 2 audit
include: "workflow/rules/certify.smk"  # any training command killed and resumed: snakemake --cores 2 certify
include: "workflow/rules/crash.smk"  # what a power loss leaves of a save: snakemake --cores 2 crash
include: "workflow/rules/site.smk"  # the audit as a static site: snakemake --cores 2 site
include: "workflow/rules/settings.smk"  # after dist.smk, whose rank layouts add to READS
include: "workflow/rules/bench.smk"


rule all:
    default_target: True
    input:
        rules.report.output,
        rules.inference.output,
        rules.settings_table.output,
        # dist/: several ranks, when asked for (snakemake --cores 2 dist builds it alone)
        rules.dist.input if DIST_IN_ALL else [],
