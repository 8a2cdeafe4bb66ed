"""The audit of other trainers' resume (snakemake audit): a client of certify, built on its public API only.

  audit.py   the scenarios, the command each framework's cell runs (its documented resume and auto-resume),
             the matrix row made from certify's verdict or crash matrix, the matrix, the releases' table
  site.py    the audit as a static site (snakemake site): the matrix and the releases' table, a page per cell
             with its certificate, a page per release environment; Jinja2 templates in templates/

The pieces, their causal order, the repairs' names, the crash outcomes and the failures are certify's
(certkit.verdict, certkit.saves, certkit.errors): imported, never declared again here.
"""
