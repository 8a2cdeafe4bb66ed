"""The audit as a static site (snakemake site: workflow/scripts/audit_site.py, trainer_audit/site.py), built from a
small fake audit written here in the layout the audit's rules leave (results/audit/F/S/cell.json and certify/
beside it; results/audit/releases/R/versions.json and R/F/S/cell.json): no framework runs.

Every expected value comes from the fake inputs below, never from the code under test. The slow test opens the
site in headless Chromium; building a real audit for it takes two hours on two cores, so it opens the fake one,
or, with MMKIT_TEST_SITE=results/site (make site after make audit), the real one, whose cells config.yaml counts.

Each test names the breakage it catches.
"""

import base64
import fcntl
import json
import os
import select
import shlex
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import yaml
from conftest import REPO, run_script

SCRIPT_TAG = "<script>alert(1)</script>"  # in a certificate's text: it must reach the page escaped
COMMAND = ["python", "examples/accelerate_loop.py", "--output_dir", "{run}", "--checkpointing_steps", "3"]
DIAGNOSIS = {"step": 4, "rank": 0, "compared": ["step 4, rank 0: differ samples"], "causes": [
    {"class": "data_position", "title": "Data position", "where": "examples/accelerate_loop.py:88 skip_first_batches",
     "evidence": f"the resumed run's samples at step 4 are the straight run's of step 12 {SCRIPT_TAG}",
     "fix": "save where the data is and resume there", "how": "skipped ahead", "from_step": 12}]}
HEADLINE = "first difference at step 4, rank 0: samples (what the model received)"
CRASH_COUNTS = {"process crash": {"exact": 2, "lost work": 0, "started over": 0, "hard fail": 3, "silent": 0},
                "power loss": {"exact": 1, "lost work": 0, "started over": 0, "hard fail": 4, "silent": 0}}
SVG = ('<svg xmlns="http://www.w3.org/2000/svg" width="120" height="20"><rect x="0" y="0" width="10" height="10" '
       'fill="#4caf50" onclick="alert(1)"/><script>alert(2)</script><text x="12" y="10">{}</text></svg>\n')

# the fake matrix: (framework, scenario) -> what its cell is, and the words a reader must find in it
FRAMEWORKS, SCENARIOS = ("own", "accelerate"), ("mid_epoch", "warmup", "crash")
CELLS = {
    ("own", "mid_epoch"): ("exact", "exact"),
    ("own", "warmup"): ("unsupported", "not supported"),
    ("own", "crash"): ("crash exact", "exact"),
    ("accelerate", "mid_epoch"): ("repaired", "repaired"),
    ("accelerate", "warmup"): ("exact", "exact"),
    ("accelerate", "crash"): ("crash fails", "7 crash points fail"),  # 3 + 4 hard fails above
}
RELEASES = {"accelerate-1.14.0": "repaired", "accelerate-1.15.0": "exact"}  # oldest first


def row(framework, scenario, kind, version="1.15.0") -> dict:
    """cell.json as trainer_audit.audit writes it, for a cell of KIND."""
    r = {"framework": framework, "version": "-" if framework == "own" else version, "torch": "2.13.0",
         "scenario": scenario, "exact": kind in ("exact", "crash exact"), "max_abs_dw": "0", "first_step": "",
         "first_state": "", "first_rank": "", "cause": "", "diagnosis": "", "repair_exact": "", "repaired": [],
         "deterministic": True}
    if kind == "repaired":
        r.update(max_abs_dw="0.0115", first_step=4, first_state="samples", first_rank=0, repair_exact=True,
                 cause="the straight run's model inputs (every forward after step K): restored by hand, then "
                       "bit-exact", diagnosis="Data position", repaired=["samples"])
    if kind == "unsupported":
        r.update(deterministic="", max_abs_dw="", cause="not supported: run.py's LR schedule has no warmup")
    if kind.startswith("crash"):
        counts = CRASH_COUNTS if kind == "crash fails" else {
            m: {**c, "exact": 5, "hard fail": 0} for m, c in CRASH_COUNTS.items()}
        r.update(max_abs_dw="", crash=counts, events=19, states=278, resumed=16, cause="crash states resumed: ...")
    return r


def write_cell(folder: Path, r: dict, kind: str) -> None:
    """FOLDER/cell.json and, where certify ran, its certificate beside it (certify/)."""
    certify = folder / "certify"
    certify.mkdir(parents=True)
    (folder / "cell.json").write_text(json.dumps(r, indent=1) + "\n")
    if kind == "unsupported":
        certify.rmdir()
        return
    if kind.startswith("crash"):
        (certify / "crash.json").write_text(json.dumps({
            "format": 1, "mode": "crash", "exact": kind == "crash exact", "command": COMMAND,
            "resume": "--resume_from_checkpoint latest", "stop_after": 6, "counts": r["crash"], "events": 19,
            "states": 278, "resumed": 16, "points": []}))
        (certify / "crash.md").write_text(f"# certify --crash: `{shlex.join(COMMAND)}`\n\n19 file events.\n")
        (certify / "crash.svg").write_text(SVG.format("crash points"))
        return
    exact = kind == "exact"
    (certify / "verdict.json").write_text(json.dumps({
        "format": 1, "exact": exact, "command": COMMAND, "resume": "--resume_from_checkpoint {run}/step_{step}",
        "stop_after": 3, "lose": 0, "again": 0, "resume_command": None, "max_abs_dw": 0.0 if exact else 0.0115,
        "diagnosis": None if exact else DIAGNOSIS, "repair": {"restored": ["samples"], "exact": True}}))
    (certify / "verdict.md").write_text(
        f"# Certificate of `{shlex.join(COMMAND)}`\n\n" + ("**exact**: every step\n" if exact else
        f"**not exact**: {HEADLINE}\n\n## Why (step 4, rank 0)\n\n- **Data position**: {SCRIPT_TAG}\n")
        + "\n![where the runs part](parting.svg)\n")
    (certify / "parting.svg").write_text(SVG.format("where the runs part"))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> dict:
    """The fake audit and the site built from it by the rule's script, as the rule calls it."""
    work = tmp_path_factory.mktemp("site")
    audit = work / "results" / "audit"
    cells = []
    for f in FRAMEWORKS:
        for s in SCENARIOS:
            kind = CELLS[f, s][0]
            write_cell(audit / f / s, row(f, s, kind), kind)
            cells.append(audit / f / s / "cell.json")
    releases = []
    for name, kind in RELEASES.items():
        version = name.split("-")[1]
        (audit / "releases" / name).mkdir(parents=True)
        (audit / "releases" / name / "versions.json").write_text(json.dumps(
            {"accelerate": version, "torch": "2.13.0+cpu", "python": "/envs/x/bin/python"}))
        folder = audit / "releases" / name / "accelerate" / "mid_epoch"
        write_cell(folder, {**row("accelerate", "mid_epoch", kind, version), "with": ""}, kind)
        releases.append(folder / "cell.json")
    out = work / "results" / "site"
    proc = run_script("audit_site.py", "--cells", *cells, "--release-cells", *releases, "--out", out, cwd=work)
    assert proc.returncode == 0, proc.stderr
    return {"out": out, "work": work}


class Page(HTMLParser):
    """What a test reads of a page: every link and source, the matrix's cells (their text and links), the text."""

    def __init__(self, path: Path):
        super().__init__()
        self.links, self.cells, self.text, self.tags, self._table, self._cell = [], [], [], [], None, None
        self.feed(path.read_text())

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        self.links += [attrs[k] for k in ("href", "src") if k in attrs]
        if tag == "table":
            self._table = attrs.get("id")
        if tag == "td" and self._table == "matrix":
            self._cell = {"text": "", "links": [], "class": attrs.get("class", "")}
        if tag == "a" and self._cell is not None:
            self._cell["links"].append(attrs["href"])

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.cells.append(self._cell)
            self._cell = None
        if tag == "table":
            self._table = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell["text"] += data


def local_target(page: Path, link: str) -> Path | None:
    """The file a relative link of PAGE points at (None for a URL elsewhere or an anchor in the page)."""
    url = urlparse(link)
    if url.scheme or url.netloc or not url.path:
        return None
    return (page.parent / unquote(url.path)).resolve()


@pytest.mark.quick
def test_the_index_has_one_linked_cell_per_framework_and_scenario(site):
    """Catches: a cell left out of the matrix or shown twice, a cell without a link to its page, a link to
    another cell's page."""
    index = site["out"] / "index.html"
    cells = Page(index).cells
    assert len(cells) == len(FRAMEWORKS) * len(SCENARIOS) == len(CELLS)
    expected = [f"cells/{f}/{s}.html" for s in SCENARIOS for f in FRAMEWORKS]  # a row per scenario
    assert [c["links"] for c in cells] == [[e] for e in expected]


@pytest.mark.quick
def test_every_link_and_source_of_every_page_resolves_to_a_file(site):
    """Catches: a page linked but not written, a link that climbs one folder too few or too many, a release
    name ('+') not escaped in its link, a picture referenced beside the certificate instead of inlined."""
    pages = sorted(site["out"].rglob("*.html"))
    assert len(pages) == 1 + len(CELLS) + 2 * len(RELEASES)  # index, cells, a page per release and per its cell
    broken = [(p.relative_to(site["out"]), link) for p in pages for link in Page(p).links
              if local_target(p, link) is not None and not local_target(p, link).is_file()]
    assert not broken
    assert all(local_target(site["out"] / "index.html", link).is_relative_to(site["out"].resolve())
               for link in Page(site["out"] / "index.html").links if local_target(site["out"] / "index.html", link))


@pytest.mark.quick
def test_each_cell_says_its_verdict_in_words_not_colour_alone(site):
    """Catches: a cell whose verdict is only its colour (a screen reader, a grey print, a colour-blind reader
    get nothing), a cell saying another cell's verdict, a not-exact cell that does not say so."""
    cells = {tuple(c["links"][0].removeprefix("cells/").removesuffix(".html").split("/")): c
             for c in Page(site["out"] / "index.html").cells}  # each cell by the page it links (checked above)
    assert sorted(cells) == sorted(CELLS)
    for key, (kind, words) in CELLS.items():
        cell = cells[key]
        assert words in cell["text"], (key, cell["text"])
        assert ("not exact" in cell["text"]) == (kind in ("repaired", "crash fails")), (key, cell["text"])


@pytest.mark.quick
def test_a_cells_page_has_its_verdict_diagnosis_command_pictures_and_reproduction(site):
    """Catches: a page without the certificate's headline or diagnosis (cause, evidence, where, fix), the command
    or its max |Δw|; a certificate's text reaching the page as HTML instead of text; a picture missing, or
    inlined with its script or event handler."""
    path = site["out"] / "cells" / "accelerate" / "mid_epoch.html"
    html, page = path.read_text(), Page(path)
    text = " ".join(" ".join(page.text).split())
    assert HEADLINE in text
    cause = DIAGNOSIS["causes"][0]
    for said in (cause["title"], cause["evidence"], cause["where"], cause["fix"], shlex.join(COMMAND), "0.0115",
                 "1.15.0", "2.13.0", "snakemake", "--repair"):
        assert said in text, said
    assert SCRIPT_TAG not in html and "alert(2)" not in html and "onclick" not in html
    assert [a.get("role") for t, a in page.tags if t == "svg"] == ["img"]  # parting.svg, inline and named
    assert [t for t, _ in page.tags if t == "img"] == []
    crash = site["out"] / "cells" / "accelerate" / "crash.html"
    assert [t for t, _ in Page(crash).tags].count("svg") == 1 and "19 file events" in crash.read_text()
    unsupported = " ".join(Page(site["out"] / "cells" / "own" / "warmup.html").text)
    assert "run.py's LR schedule has no warmup" in unsupported


@pytest.mark.quick
def test_each_release_has_a_page_with_its_versions_and_where_it_differs_from_the_release_before(site):
    """Catches: a release page without its versions, or one that does not say where its verdict changed."""
    older, newer = ((site["out"] / "releases" / f"{name}.html").read_text() for name in RELEASES)
    assert "<td>1.14.0</td>" in older and "the oldest audited" in older
    assert "<td>1.15.0</td>" in newer and '<td class="differs">yes</td>' in newer  # repaired, then exact


@pytest.mark.quick
def test_every_page_is_valid_html_with_a_language_a_charset_and_a_title(site):
    """Catches: markup a browser must repair (a tag left open or closed twice, a table cell outside its row: a
    parse error of the HTML standard's algorithm, html5lib strict), a page a screen reader cannot pronounce
    (no lang), mis-decoded (no charset: Δw, ✓) or without a title in a tab or a history."""
    import html5lib

    strict = html5lib.HTMLParser(strict=True)
    with pytest.raises(html5lib.html5parser.ParseError):  # the check sees a parse error where there is one
        strict.parse("<!DOCTYPE html><html lang=\"en\"><head><title>t</title></head><body><table><td>x</p>")
    for path in site["out"].rglob("*.html"):
        html = path.read_text()
        try:
            strict.parse(html)
        except html5lib.html5parser.ParseError as e:
            pytest.fail(f"{path.relative_to(site['out'])}: {e}")
        assert html.startswith("<!DOCTYPE html>\n<html lang=\"en\">"), path
        page = Page(path)
        assert ("meta", {"charset": "utf-8"}) in page.tags and html.count("<title>") == 1, path


# the W3C's Nu Html Checker (https://validator.github.io/validator/: the jar, on npm as vnu-jar), on Java
# (Debian's default-jre-headless; .ci/run installs it)
NU_CHECKER = "vnu-jar@26.9.27"


@pytest.fixture(scope="module")
def nu_checker() -> list:
    """The command that runs the Nu Html Checker: its jar in this venv's node/ folder (npm, if it is not there)."""
    jar = Path(os.sys.prefix) / "node" / "node_modules" / "vnu-jar" / "build" / "dist" / "vnu.jar"
    if not shutil.which("java"):
        pytest.skip("no java for the Nu Html Checker: apt-get install -y --no-install-recommends default-jre-headless")
    if not jar.exists():
        if not shutil.which("npm"):
            pytest.skip("no npm to install the Nu Html Checker")
        subprocess.run(["npm", "install", "--prefix", jar.parents[4], "--no-audit", "--no-fund", NU_CHECKER],
                       check=True, capture_output=True, timeout=300)
    return ["java", "-jar", str(jar)]


@pytest.mark.slow
def test_every_page_passes_the_nu_html_checker(browsed, nu_checker, tmp_path):
    """Catches: what the parser lets through and the standard forbids (an attribute an element may not have, an
    id twice on a page, a table whose rows have no cells, a heading with nothing in it); and a checker that sees
    nothing (a page with such errors must fail)."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>bad</title></head><body>'
                   '<p id="a" align="middle">x</p><p id="a">y</p></body></html>')
    seen = subprocess.run([*nu_checker, "--errors-only", bad], capture_output=True, text=True, timeout=300)
    assert seen.returncode != 0 and "Duplicate ID" in seen.stderr, seen.stderr
    out, _ = browsed
    proc = subprocess.run([*nu_checker, "--skip-non-html", out], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]


# a linter for workflow files (against SchemaStore's schema), as certify/tests/test_ci.py lints certify's action.yml
ACTION_VALIDATOR = "@action-validator/cli@0.6.0"
WORKFLOW = REPO / ".github" / "workflows" / "site.yml"


@pytest.fixture(scope="module")
def action_validator():
    """action-validator in this venv's node/ folder, where certify's tests install it (npm, if it is not there)."""
    tool = Path(os.sys.prefix) / "node" / "node_modules" / ".bin" / "action-validator"
    if not tool.exists():
        if not shutil.which("npm"):
            pytest.skip("no npm to install action-validator")
        subprocess.run(["npm", "install", "--prefix", tool.parents[2], "--no-audit", "--no-fund", ACTION_VALIDATOR],
                       check=True, capture_output=True, timeout=300)
    return tool


def test_the_pages_workflow_passes_the_linter_and_deploys_through_the_official_actions(action_validator, tmp_path):
    """Catches: a workflow GitHub would refuse (a misspelt key), one that no longer rebuilds on a schedule, by
    hand or on a framework's release, or deploys without the Pages actions and their permissions; and a linter
    that accepts anything (a copy with one misspelt key must fail)."""
    lint = subprocess.run([action_validator, WORKFLOW], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    (tmp_path / "site.yml").write_text(WORKFLOW.read_text().replace("runs-on:", "runs-onn:", 1))
    lint = subprocess.run([action_validator, tmp_path / "site.yml"], capture_output=True, text=True)
    assert lint.returncode == 1, lint.stdout + lint.stderr
    flow = yaml.safe_load(WORKFLOW.read_text())
    triggers = flow[True]  # YAML 1.1 reads the key `on` as true
    assert {"schedule", "workflow_dispatch", "repository_dispatch"} <= set(triggers)
    uses = [s.get("uses", "").split("@")[0] for job in flow["jobs"].values() for s in job["steps"]]
    assert {"actions/configure-pages", "actions/upload-pages-artifact", "actions/deploy-pages"} <= set(uses)
    assert flow["jobs"]["deploy"]["permissions"] == {"pages": "write", "id-token": "write"}
    assert "make site" in [s.get("run") for s in flow["jobs"]["build"]["steps"]]


# --- in a real browser ----------------------------------------------------------------------------------------

class Browser:
    """Headless Chromium driven through the DevTools protocol over a pipe (--remote-debugging-pipe: JSON
    messages, each ended by a NUL, read on the child's fd 3 and written on its fd 4): no port, no websocket."""

    def __init__(self, chromium: str, profile: Path):
        to_r, self.to_w = os.pipe()
        self.from_r, from_w = os.pipe()
        # above any fd the child is handed, so that moving them to 3 and 4 in the child overwrites neither
        to_r, from_w = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_r, from_w))

        def onto_3_and_4():
            os.dup2(to_r, 3)
            os.dup2(from_w, 4)

        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
             f"--user-data-dir={profile}", "about:blank"],
            preexec_fn=onto_3_and_4, pass_fds=(3, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.buffer, self.events, self.next_id = b"", [], 0
        page = next(t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=self.session)

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        os.write(self.to_w, json.dumps({**message, **({"sessionId": session} if session else {})}).encode() + b"\0")
        while True:
            reply = self.read(timeout)
            if reply.get("id") == self.next_id:
                assert "error" not in reply, (method, reply["error"])
                return reply["result"]
            self.events.append(reply)

    def read(self, timeout: float) -> dict:
        while b"\0" not in self.buffer:
            ready, _, _ = select.select([self.from_r], [], [], timeout)
            assert ready, "chromium did not answer"
            chunk = os.read(self.from_r, 1 << 20)
            assert chunk, "chromium closed its pipe"
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def open(self, url: str) -> list:
        """Load URL; the errors it logged: console errors, uncaught exceptions, resources that failed to load."""
        self.events = []
        result = self.call("Page.navigate", {"url": url}, session=self.session)
        assert "errorText" not in result, (url, result["errorText"])
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self.events.append(self.read(60))
        self.call("Runtime.evaluate", {"expression": "1"}, session=self.session)  # what the load logged arrives
        return [e["params"] for e in self.events
                if e.get("method") == "Runtime.exceptionThrown"
                or e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert")
                or e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"]

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                         session=self.session)["result"]["value"]

    def close(self):
        self.proc.kill()
        self.proc.wait(timeout=30)
        os.close(self.to_w)
        os.close(self.from_r)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Chromium (Debian's package `chromium`; in CI: apt-get install -y --no-install-recommends chromium)."""
    chromium = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    if chromium is None:
        pytest.skip("no chromium: apt-get install -y --no-install-recommends chromium")  # a failure where CI=true
    b = Browser(chromium, tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


@pytest.fixture(scope="module")
def browsed(site) -> tuple[Path, int]:
    """The site the browser opens and its number of cells: the fake one's, or MMKIT_TEST_SITE's (a site built
    from the real audit: a cell for each of config.yaml's frameworks and scenarios)."""
    real = os.environ.get("MMKIT_TEST_SITE")
    if not real:
        return site["out"], len(CELLS)
    audit = yaml.safe_load((REPO / "config.yaml").read_text())["audit"]
    return Path(real).resolve(), len(audit["frameworks"]) * len(audit["scenarios"])


@pytest.mark.slow
def test_in_a_browser_every_cell_opens_its_page_no_page_logs_an_error_and_the_index_renders(browsed, browser,
                                                                                           tmp_path):
    """Catches: a link the browser cannot follow, a page that logs an error (a resource not found, a script),
    a screenshot that is blank; and a check of errors that sees none (a page with a console error and a missing
    picture must show both)."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>bad</title></head><body>'
                   '<img src="missing.png" alt="x"><script>console.error("seen")</script></body></html>')
    assert len(browser.open(bad.as_uri())) >= 2
    out, cells = browsed
    index = out / "index.html"
    assert browser.open(index.as_uri()) == []
    links = browser.evaluate("[...document.querySelectorAll('#matrix td a')].map(a => a.href)")
    assert len(links) == cells
    pages = {urlparse(link).path for link in links} | {p.as_uri() for p in out.rglob("*.html")}
    for link in links:
        assert Path(unquote(urlparse(link).path)).is_file(), link
    for page in sorted(pages):
        url = page if page.startswith("file:") else f"file://{page}"
        assert browser.open(url) == [], url
    browser.call("Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 800, "deviceScaleFactor": 1,
                                                        "mobile": False}, session=browser.session)
    browser.open(index.as_uri())
    shot = tmp_path / "index.png"
    shot.write_bytes(base64.b64decode(browser.call("Page.captureScreenshot", {"format": "png"},
                                                   session=browser.session)["data"]))
    from PIL import Image

    with Image.open(shot) as image:
        assert image.format == "PNG" and image.size == (1280, 800)
        assert len(image.convert("RGB").getcolors(1 << 24)) > 16  # text, tints and stripes: not one flat colour
