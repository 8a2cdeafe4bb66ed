# Speed, side by side with transformers: not part of the experiment, so rule all does not need it.
# Needs transformers (requirements-test.txt). snakemake --cores 2 bench


rule bench:
    input:
        code=code_inputs("bench/bench.py"),  # its sections, and the package's modules they import
        script="bench/bench.py",
        # bench/memory.py times run.py in its own process
        run=RUN,
        run_code=code_inputs(RUN),
    output:
        csv=f"{OUT}/bench/results.csv",
        md=f"{OUT}/bench/results.md",
        targets=f"{OUT}/bench/targets.md",
    log:
        f"{OUT}/logs/bench.log",
    conda:
        ENV
    threads: 2
    resources:
        cpus_per_task=2,
        mem_mb=4000,  # MiniMind2-small in this project's model and in transformers', side by side
        runtime=90,
    shell:
        "python {input.script} --out-csv {output.csv} --out-md {output.md}"
        " --out-targets {output.targets} 2> {log}"
