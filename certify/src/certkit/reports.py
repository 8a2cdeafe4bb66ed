"""The verdict for CI: a JUnit testsuite per certify run (a testcase per rank) and a Markdown summary that
appends to GitHub's step summary ($GITHUB_STEP_SUMMARY). Both are written after the verdict, and also when
certify could not judge (then the suite holds one error and the summary says why).
"""

import contextlib
import os
import xml.etree.ElementTree as ET
from pathlib import Path

from . import outdir
from .errors import CannotJudge
from .verdict import FAILING, NAMES, headline, why, why_section


def difference_line(rank, first: dict) -> str:
    return f"first difference at step {first['step']}, rank {rank}: {NAMES[first['piece']]}"


def suite(found: dict | None, command: str, out: Path, error: str | None = None) -> ET.Element:
    """The testsuite of one certify run: a testcase per rank of the straight run, failing where that rank
    parts from it (its own first difference); where nothing differs but the run started over, every rank
    fails with the verdict's line. ERROR: certify could not judge, one erroring testcase saying why."""
    name = f"certify {out.name}: {command}"
    element = ET.Element("testsuite", name=name)
    if error is not None:
        case = ET.SubElement(element, "testcase", classname=f"certify.{out.name}", name="judge")
        ET.SubElement(case, "error", message=error, type="could not judge").text = error
        element.set("tests", "1"), element.set("failures", "0"), element.set("errors", "1")
        return element
    line, failures = headline(found).replace("**", ""), 0
    nowhere = not found["exact"] and not any(found["first_by_rank"].values())  # started over: every rank fails
    for rank, first in found["first_by_rank"].items():
        case = ET.SubElement(element, "testcase", classname=f"certify.{out.name}", name=f"rank {rank}")
        if first is not None or nowhere:
            message = difference_line(rank, first) if first is not None else line
            if first is not None and why(found) and str(found["diagnosis"]["rank"]) == str(rank):
                message += f"; {why(found)}"
            ET.SubElement(case, "failure", message=message, type="not exact").text = line
            failures += 1
    element.set("tests", str(len(found["first_by_rank"]))), element.set("failures", str(failures))
    element.set("errors", "0")
    return element


def crash_suite(found: dict, command: str, out: Path) -> ET.Element:
    """certify --crash's testsuite: a testcase per crash point and failure model, failing with its outcome
    (hard fail, silent, lost work, started over) and what it says; one not resumed (--max-points) skipped."""
    element = ET.Element("testsuite", name=f"certify --crash {out.name}: {command}")
    failures = skipped = 0
    for p in found["points"]:
        model = p["model"].split(" (")[0].replace(" ", "_")
        case = ET.SubElement(element, "testcase", classname=f"certify.crash.{model}",
                             name=f"{p['model']}: after event {p['event']} ({p['what']})")
        if p["outcome"] in FAILING:
            detail = p.get("why") or f"resumed from step {p['resumed_from']}: {p['lost']} steps lost"
            ET.SubElement(case, "failure", message=f"{p['outcome']}: {detail}", type=p["outcome"]).text = p["rebuild"]
            failures += 1
        elif p["outcome"] != "exact":
            ET.SubElement(case, "skipped", message=p["outcome"])
            skipped += 1
    for name, n in (("tests", len(found["points"])), ("failures", failures), ("errors", 0), ("skipped", skipped)):
        element.set(name, str(n))
    return element


def write_junit(path: Path, element: ET.Element) -> None:
    """PATH's <testsuites> with ELEMENT in it, replacing a suite of the same name (the same --out) and keeping
    those of other certify runs; written whole (a .tmp renamed over it). A file that is not a <testsuites>
    of JUnit XML is not overwritten: CannotJudge."""
    root = ET.Element("testsuites", name="certify")
    if path.exists():
        try:
            root = ET.parse(path).getroot()
        except (ET.ParseError, OSError) as e:
            raise CannotJudge(f"--junit {path}: not JUnit XML certify can add to ({e}); give another file") from None
        if root.tag != "testsuites":
            raise CannotJudge(f"--junit {path}: its root is <{root.tag}>, not <testsuites>; give another file")
    for old in [s for s in root.findall("testsuite") if s.get("name") == element.get("name")]:
        root.remove(old)
    root.append(element)
    for key in ("tests", "failures", "errors"):
        root.set(key, str(sum(int(s.get(key, "0")) for s in root.findall("testsuite"))))
    ET.indent(root)
    outdir.write_atomic(path, ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n")


def summary(found: dict | None, command: str, out: Path, rerun: str, error: str | None = None) -> str:
    """Markdown for a CI step summary: the verdict, the first difference (each rank's), the steps compared,
    the command that reruns it, and where the picture is."""
    tick = "`" * 3
    if error is not None:
        return "\n".join([f"### certify: could not judge", "", f"`{command}`", "", error, "", "Rerun:", "",
                          f"{tick}sh", rerun, tick, ""]) + "\n"
    title = "exact" if found["exact"] else "not exact"
    lines = [f"### certify: {title}", "", f"`{command}`", "", headline(found), ""]
    if found["first_by_rank"]:
        lines += ["| rank | first difference |", "|---|---|"]
        lines += [f"| {rank} | " + (f"step {f['step']}: {NAMES[f['piece']]}" if f else "none") + " |"
                  for rank, f in found["first_by_rank"].items()]
        lines.append("")
    if found.get("diagnosis"):
        lines += [line.replace("## Why", "#### Why") for line in why_section(found)]
    start = found.get("resumed_from", found["stop_after"])
    lines += [f"Compared: optimizer steps {start + 1}..{found['last_step']} of the resumed run against the straight "
              f"run (stopped after step {found['stop_after']}).", "",
              "Rerun:", "", f"{tick}sh", rerun, tick, ""]
    if (out / "parting.svg").exists():
        lines += [f"Where the runs part: `{out / 'parting.svg'}` (and `{out / 'verdict.md'}`).", ""]
    return "\n".join(lines) + "\n"


def append_summary(path: Path, text: str) -> None:
    """TEXT appended to PATH, as GitHub's step summary is written (each step adds its own)."""
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            with contextlib.suppress(OSError):
                os.fsync(f.fileno())
    except OSError as e:
        raise outdir.cannot(path, e) from None
