# The audit as pages people browse (snakemake --cores 2 site; not in all): a static site of the matrix and the
# releases' table, each cell linked to a page with its certificate, in OUTDIR/site/; it opens from disk.
# It needs the audit's cells and the releases' (config audit_releases: an empty releases list leaves that
# table out).


rule site:
    input:
        code=code_inputs(SCRIPTS / "audit_site.py"),
        script=SCRIPTS / "audit_site.py",
        # the pages' templates: package data, not imports, so code_inputs cannot see them
        templates=sorted(
            map(
                str,
                (installed_root("trainer_audit") / "trainer_audit" / "templates").glob(
                    "*.html"
                ),
            )
        ),
        cells=rules.audit_matrix.input.cells,
        releases=rules.audit_releases.input.cells,
        # the release environments' versions, which each release's page lists
        versions=expand(rules.release_env.output.versions, release=RELEASE_ENVS),
    output:
        # a folder: the pages are named after the cells of the config, and a cell dropped takes its page along
        site=directory(f"{OUT}/site"),
    log:
        f"{OUT}/logs/site.log",
    localrule: True
    conda:
        ENV
    shell:
        "python {input.script} --cells {input.cells} --release-cells {input.releases}"
        " --out {output.site} 2> {log}"
