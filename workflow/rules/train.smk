# Every training artifact is one call of run.py: the same model, optimizer, data and loop. Each is an
# entry of TRAINING_JOBS; training.smk makes each entry a rule, all with one body.

from typing import NamedTuple

from mmkit.ablations import ABLATIONS

RUN = SCRIPTS / "run.py"


class TrainingJob(NamedTuple):
    """One call of run.py. Its outputs: FOLDER/STEM.pth (the weights, or with --stop-at the resume file;
    OUT instead where given: a resume directory), FOLDER/STEM_log.csv, FOLDER/timing/STEM.json; its log
    FOLDER/logs/STEM.log. FLAGS: --stop-at (save the resume file after stop_at steps), an ablation, a rank
    layout's; RESUME: the resume it continues from."""

    folder: str
    stem: str
    settings: str  # the entry of READS its settings file holds
    ranks: int
    flags: str = ""
    resume: str | None = None
    out: str | None = None


WORLD_SIZE = config["parallel"]["world_size"]
# the resume file: the weights and all a resume needs besides
RESUME = f"{OUT}/resume.pth"
TRAINING_JOBS = {
    "straight": TrainingJob(OUT, "straight", "straight", WORLD_SIZE),
    "resume": TrainingJob(OUT, "resume", "resume", WORLD_SIZE, "--stop-at"),
    "resumed": TrainingJob(OUT, "resumed", "resumed", WORLD_SIZE, resume=RESUME),
}
# The ablations (mmkit.ablations.ABLATIONS: each one's flag and job): resume with one piece of the resume file
# thrown away or re-derived. replay, norng and noscaler are the new paths' (minimind format, dropout > 0,
# fp16), built where their path is on (analysis.smk: VARIANTS); one for another world size is dist.smk's.
# halfresume is no ablation of the resume's code but of its file: its fingerprint says fp16 weights, resumed
# on purpose (--allow-mismatch), not bit-exact
for ablation in ABLATIONS.values():
    if not ablation.reshard:
        TRAINING_JOBS[ablation.job] = TrainingJob(
            OUT, ablation.job, "resumed", WORLD_SIZE, ablation.flag, RESUME
        )
TRAINING_JOBS["halfresume"] = TrainingJob(
    OUT,
    "halfresume",
    "resumed",
    WORLD_SIZE,
    "--allow-mismatch",
    f"{OUT}/resume_fp16.pth",
)


rule resume_fp16:
    input:
        code=code_inputs(SCRIPTS / "halve_resume.py"),
        script=SCRIPTS / "halve_resume.py",
        resume=RESUME,
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
