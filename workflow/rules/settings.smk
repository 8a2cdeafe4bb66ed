# Each job's settings file: the config keys its rule declares in READS (config.smk), and nothing else.
# Included after dist.smk, whose rank layouts add to READS: the wildcard takes every name in it.


rule settings:
    input:
        code=code_inputs(SCRIPTS / "write_text.py"),
        script=SCRIPTS / "write_text.py",
    output:
        f"{OUT}/settings/{{name}}.yaml",
    log:
        f"{OUT}/logs/settings/{{name}}.log",
    wildcard_constraints:
        name="|".join(READS),
    localrule: True
    conda:
        ENV
    params:
        # a param: Snakemake reruns this job when one of its values changes, and so the jobs reading it
        text=lambda w: yaml.safe_dump(settings_values(w.name), sort_keys=False),
    shell:
        "python {input.script} {output} {params.text:q} 2> {log}"


# which settings rerun which rules: the README's table, generated from READS and the rules' inputs
rule settings_table:
    input:
        code=code_inputs(SCRIPTS / "write_text.py"),
        script=SCRIPTS / "write_text.py",
    output:
        f"{OUT}/settings.md",
    log:
        f"{OUT}/logs/settings_table.log",
    localrule: True
    conda:
        ENV
    params:
        text=lambda w: settings_table(),
    shell:
        "python {input.script} {output} {params.text:q} 2> {log}"
