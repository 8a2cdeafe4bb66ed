# Each job's settings file: the config keys its rule declares in READS, and nothing else.


rule settings:
    input:
        code=package(),
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
        code=package(),
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


rule tokenize:
    input:
        code=package("config", "data", "checkpoint"),
        script=SCRIPTS / "prepare_data.py",
        settings=settings("tokenize"),
        # the user's tokenizer.json (data.tokenizer), when named: its content, not only its name, matters
        given=config["data"]["tokenizer"] or [],
    output:
        tokenizer=f"{OUT}/data/tokenizer.json",
        train=f"{OUT}/data/train.npy",
        val=f"{OUT}/data/val.npy",
        jsonl=f"{OUT}/data/train.jsonl",
    log:
        f"{OUT}/logs/tokenize.log",
    conda:
        ENV
    resources:
        **ANALYSIS_RESOURCES,
    shell:
        "python {input.script} --config {input.settings} --tokenizer {output.tokenizer}"
        " --train {output.train} --val {output.val} --jsonl {output.jsonl} 2> {log}"
