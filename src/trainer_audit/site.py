"""The audit as pages people browse (snakemake site): a static site under results/site/ that opens from disk,
with no server, no network and no script.

  index.html                      the matrix, scenarios by frameworks, each cell its verdict in words and a
                                  link to its page; the crash counts, the negative controls, the releases
  cells/F/S.html                  a cell: its command, verdict, diagnosis, pictures, max |Δw|, versions, the
                                  commands that reproduce it, and its certificate (verdict.md or crash.md)
  releases/R.html, releases/R/F/S.html   a release environment: its versions, its cells and where they differ
                                  from the release before; each of its cells a page as above

Rendered with Jinja2 (templates/ beside this module, autoescaped) and markdown-it-py (raw HTML off); the two
pictures certify draws are inlined after their XML is parsed and stripped of anything that could run.
"""

import json
import shlex
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markdown_it import MarkdownIt
from markupsafe import Markup

from mmkit.atomic import write_text_atomic
from trainer_audit.audit import (CRASH_POINTS, SCENARIOS, cell_text, crash_table, first_exact, release_label,
                                 release_order, verdict)

# each verdict's symbol, the words its cells say, and what it means: for the legend and the cells, so that the
# words say what the colour says
VERDICTS = {
    "exact": ("✓", "exact", "bit-exact: every step after the cut, and the final weights, equal the straight run's"),
    "repaired": ("◐", "not exact: …, repaired", "exact once the piece the certificate named is restored by hand"),
    "unknown": ("✗", "not exact: …, cause unknown (not repaired, on fewer ranks)",
                "no repair made it exact, or none applies (two resumes, a resume on fewer ranks)"),
    "crash": ("✗", "not exact: N crash points fail",
              "a crash inside the save left states the framework's own auto-resume did not resume exactly"),
    "failed": ("!", "resume failed (cannot run here)", "the resume did not run, or a release could not run the script"),
    "unsupported": ("–", "not supported (skipped)",
                    "the script has no way to run the scenario, or a release cannot be installed beside this torch"),
}
SVG = "http://www.w3.org/2000/svg"
ET.register_namespace("", SVG)  # serialised back as <svg xmlns=...>, not <ns0:svg>


@dataclass
class Cell:
    """One audit cell as the site shows it: its matrix row (cell.json) and what certify wrote beside it."""
    row: dict
    folder: Path  # the cell's folder: cell.json, and certify/ where it ran
    page: str  # its page, relative to the site's root
    release: str = ""  # the release environment it ran in; "" for the audit's own cells
    certificate: dict = field(default_factory=dict)  # verdict.json or crash.json, if certify wrote one

    @property
    def verdict(self) -> str:
        return verdict(self.row)

    @property
    def crash(self) -> bool:
        return self.certificate.get("mode") == "crash"


def read_cell(path: Path, release: str = "") -> Cell:
    row = json.loads(path.read_text())
    certify = path.parent / "certify"
    found = next((certify / n for n in ("verdict.json", "crash.json") if (certify / n).is_file()), None)
    prefix = f"releases/{release}/" if release else "cells/"
    return Cell(row, path.parent, f"{prefix}{row['framework']}/{row['scenario']}.html", release,
                json.loads(found.read_text()) if found else {})


def words(row: dict) -> str:
    """The cell's verdict in words, as Markdown: summary.md's text (the README's), with "not exact: " before a
    difference, and a release that could not be installed or run here called so."""
    if row["cause"].startswith(("skipped", "cannot run here")):
        return row["cause"].split(":")[0]
    text = cell_text(row)
    return f"not exact: {text}" if verdict(row) in ("repaired", "unknown", "crash") else text


def certify_command(cell: Cell) -> str:
    """The certify command line that makes this cell's certificate again, from what the certificate recorded."""
    c = cell.certificate
    argv = ["certify", "--out", str(cell.folder / "certify"), "--stop-after", str(c["stop_after"])]
    if c.get("resume"):
        argv.append(f"--resume={c['resume']}")
    if cell.crash:
        argv += ["--crash", "--max-points", str(CRASH_POINTS)]  # the audit's: crash.json keeps how many it resumed
    else:
        argv += [f"--{k}={c[k]}" for k in ("lose", "again") if c.get(k)]
        if c.get("resume_command"):
            rc = c["resume_command"]
            argv.append(f"--resume-command={rc if isinstance(rc, str) else shlex.join(rc)}")
        argv += ["--repair"] if "repair" in c else []
        argv += ["--control"] if "control" in c else []
    return shlex.join([*argv, "--", *c["command"]])


def inline_svg(path: Path, label: str) -> Markup | None:
    """PATH's picture to place in a page: parsed as XML (a broken file is no picture), with no script,
    foreign object or event handler left in it, and named for screen readers."""
    if not path.is_file():
        return None
    try:
        root = ET.fromstring(path.read_text())
    except ET.ParseError:
        return None
    if root.tag != f"{{{SVG}}}svg":
        return None
    for parent in list(root.iter()):
        for child in list(parent):
            if child.tag in (f"{{{SVG}}}script", f"{{{SVG}}}foreignObject"):
                parent.remove(child)
        for name in [n for n in parent.attrib if n.lower().startswith("on") or "href" in n]:
            del parent.attrib[name]
    root.set("role", "img")
    root.set("aria-label", label)
    return Markup(ET.tostring(root, encoding="unicode"))


def markdown() -> MarkdownIt:
    """Markdown with tables and without raw HTML (js-default): a certificate's text is escaped, never run."""
    return MarkdownIt("js-default")


def render_markdown(md: MarkdownIt, text: str, shift: int = 0) -> Markup:
    """TEXT as HTML, its headings SHIFT levels down (a certificate's # under the page's own h1), its local
    pictures left out (the page inlines them itself: a link to a file beside the certificate would not resolve)."""
    tokens = md.parse(text)
    for t in tokens:
        if t.type in ("heading_open", "heading_close"):
            t.tag = f"h{min(int(t.tag[1]) + shift, 6)}"
        if t.type == "inline" and t.children:
            t.children = [c for c in t.children if not (c.type == "image" and ":" not in c.attrGet("src"))]
    # a paragraph that held only such a picture is gone with it
    empty = {i + d for i, t in enumerate(tokens[:-2]) if t.type == "paragraph_open" and not tokens[i + 1].children
             for d in range(3)}
    tokens = [t for i, t in enumerate(tokens) if i not in empty]
    return Markup(md.renderer.render(tokens, md.options, {}))


def href(page: str) -> str:
    return quote(page)  # release names hold '+'


def build(cell_paths: list, release_paths: list, out: Path) -> list:
    """The site in OUT from the audit's cells (their cell.json paths) and the releases' (CELL_PATHS and
    RELEASE_PATHS, in the matrix's order); returns the pages written, relative to OUT."""
    env = Environment(loader=PackageLoader("trainer_audit", "templates"), autoescape=select_autoescape(["html"]),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    md = markdown()
    env.filters["md"] = lambda text: render_markdown(md, text)
    env.filters["md_inline"] = lambda text: Markup(md.renderInline(text))
    env.filters["href"] = href
    env.globals.update(VERDICTS=VERDICTS, SCENARIOS=SCENARIOS, words=words)
    cells = [read_cell(Path(p)) for p in cell_paths]
    releases = sorted((read_cell(Path(p), Path(p).parents[2].name) for p in release_paths),
                      key=lambda c: release_order(c.row))
    pages = {"index.html": index_page(env, cells, releases)}
    for cell in cells + releases:
        pages[cell.page] = cell_page(env, md, cell)
    for name, html in release_pages(env, releases).items():
        pages[name] = html
    for name, html in pages.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / name, html)
    return list(pages)


def root_of(page: str) -> str:
    """The way back to the site's root from PAGE: links are relative, so the site opens from any folder."""
    return "../" * page.count("/")


def index_page(env: Environment, cells: list, releases: list) -> str:
    frameworks = list(dict.fromkeys(c.row["framework"] for c in cells))
    scenarios = list(dict.fromkeys(c.row["scenario"] for c in cells))
    by = {(c.row["framework"], c.row["scenario"]): c for c in cells}
    crashes = [c.row for c in cells if c.row.get("crash")]
    controls = [c.row["control"] for c in cells if "control" in c.row]
    return env.get_template("index.html").render(
        root="", title="Do other trainers resume exactly?", frameworks=frameworks, scenarios=scenarios,
        grid=[[by.get((f, s)) for s in scenarios] for f in frameworks],
        crash_table=crash_table(crashes) if crashes else "", controls=controls, releases=release_rows(releases), torch=cells[0].row["torch"] if cells else "")


def release_rows(releases: list) -> dict:
    """The releases' table: {framework: (scenarios, [(release, label, [cell per scenario])], [first exact per
    scenario])}, oldest release first."""
    table = {}
    for framework in dict.fromkeys(c.row["framework"] for c in releases):
        mine = [c for c in releases if c.row["framework"] == framework]
        scenarios = list(dict.fromkeys(c.row["scenario"] for c in mine))
        by = {(c.release, c.row["scenario"]): c for c in mine}
        names = list(dict.fromkeys(c.release for c in mine))
        rows = [(n, release_label(by[n, scenarios[0]].row), [by[n, s] for s in scenarios]) for n in names]
        firsts = [first_exact([by[n, s].row for n in names]) for s in scenarios]
        table[framework] = (scenarios, rows, firsts)
    return table


def cell_page(env: Environment, md: MarkdownIt, cell: Cell) -> str:
    c, certify = cell.certificate, cell.folder / "certify"
    text = next((f.read_text() for f in (certify / "crash.md", certify / "verdict.md") if c and f.is_file()), "")
    name = f"{cell.row['framework']} · {cell.row['scenario']}"
    return env.get_template("cell.html").render(
        root=root_of(cell.page), title=f"{name}{f' ({cell.release})' if cell.release else ''}", cell=cell,
        row=cell.row, scenario=SCENARIOS[cell.row["scenario"]],
        command=shlex.join(c["command"]) if c else "", resume=c.get("resume", ""),
        diagnosis=c.get("diagnosis"), certify=certify_command(cell) if c else "",
        snakemake=f"snakemake --cores 2 --forcerun {'release_cell' if cell.release else 'audit_cell'} "
                  f"{shlex.quote(str(cell.folder / 'cell.json'))}",
        pictures=[p for p in (inline_svg(certify / "parting.svg", f"where the runs part: {name}"),
                              inline_svg(certify / "crash.svg", f"every crash point and its outcome: {name}")) if p],
        certificate=render_markdown(md, text, shift=2) if text else None)


def release_pages(env: Environment, releases: list) -> dict:
    """A page per release environment: its versions (versions.json beside its cells), its cells, and for each
    the verdict of the same cell in the release before it (oldest first), marked where they differ."""
    before, previous = {}, {}
    for cell in releases:  # oldest first: the cell of the same framework and scenario one release earlier
        key = (cell.row["framework"], cell.row["scenario"])
        before[id(cell)] = previous.get(key)
        previous[key] = cell
    pages = {}
    for name in dict.fromkeys(c.release for c in releases):
        mine = [c for c in releases if c.release == name]
        versions = json.loads((mine[0].folder.parents[1] / "versions.json").read_text())
        page = f"releases/{name}.html"
        pages[page] = env.get_template("release.html").render(
            root=root_of(page), title=f"Release environment {name}", name=name,
            versions={k: v for k, v in versions.items() if k != "python"},  # the venv's path on the auditing machine
            cells=[(c, before[id(c)]) for c in mine])
    return pages
