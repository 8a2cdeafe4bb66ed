"""README.md and docs/*.md: every link resolves, and every generated block lives in one file that make readme fills."""

import re
import shutil

import pytest
from conftest import REPO, run_script

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"<!-- (\w+):start -->\n(.*?)<!-- \1:end -->", re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """TEXT without its fenced code blocks, whose brackets are code, not links."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def readme_recipe() -> str:
    """The Makefile's readme recipe: its lines up to the next blank line."""
    return re.search(r"^readme:.*?\n\n", (REPO / "Makefile").read_text(), re.S | re.M)[0]


def built(doc, target: str) -> bool:
    """Whether TARGET, linked from DOC, lies in a folder of the outdir that a rule writes (the site's index:
    an artifact, not a tracked file), the outdir being config.yaml's."""
    outdir = re.search(r"^outdir: (\S+)$", (REPO / "config.yaml").read_text(), re.M)[1]
    parts = (doc.parent / target).resolve().relative_to(REPO).parts
    rules = "".join(path.read_text() for path in (REPO / "workflow" / "rules").glob("*.smk"))
    return len(parts) > 2 and parts[0] == outdir and f'f"{{OUT}}/{parts[1]}' in rules


@pytest.mark.quick
def test_every_relative_link_points_to_an_existing_file():
    # catches: a topic file renamed or moved without its links; a link written from the repository root inside
    # docs/ (bench/results.md where ../bench/results.md is meant); a link to an artifact (results/site/index.html)
    # whose folder no rule writes (renamed), or written from the wrong folder
    broken = []
    for doc in DOCS:
        for target in LINK.findall(prose(doc.read_text())):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL, or a heading of the same page
            if not (doc.parent / target.split("#")[0]).exists() and not built(doc, target):
                broken.append(f"{doc.relative_to(REPO)}: {target}")
    assert not broken
    # and the README links every topic in docs/
    linked = set(LINK.findall(prose((REPO / "README.md").read_text())))
    assert {f"docs/{p.name}" for p in DOCS[1:]} <= linked


@pytest.mark.quick
def test_every_generated_block_lives_in_one_file_and_make_readme_fills_it():
    # catches: a block copied into two files (one of them would go stale), a block lost in a move (make readme
    # would fail only after its builds), a block make readme never fills, docs/*.md dropped from the recipe
    recipe = readme_recipe()
    filled = re.findall(r"\s(\w+)=\S+", recipe)
    assert re.search(r"update_readme\.py README\.md docs/\*\.md ", recipe)
    holders = {}
    for doc in DOCS:
        for name, _ in BLOCK.findall(doc.read_text()):
            holders.setdefault(name, []).append(doc.relative_to(REPO))
    assert sorted(holders) == sorted(filled)
    assert {name: docs for name, docs in holders.items() if len(docs) != 1} == {}


def copy_docs(tmp_path) -> list:
    (tmp_path / "docs").mkdir()
    for doc in DOCS:
        shutil.copy(doc, tmp_path / doc.relative_to(REPO))
    return [tmp_path / doc.relative_to(REPO) for doc in DOCS]


@pytest.mark.quick
def test_refilling_every_block_with_its_own_text_changes_no_byte(tmp_path):
    # catches: a splice that adds or drops a newline at a block's edge, or touches text outside it; a file
    # rewritten when nothing in it changed
    copies = copy_docs(tmp_path)
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in copies}
    args = []
    for p in copies:
        for name, text in BLOCK.findall(p.read_text()):
            (tmp_path / f"{name}.block").write_text(text)
            args.append(f"{name}={tmp_path / f'{name}.block'}")
    proc = run_script("update_readme.py", *copies, *args)
    assert proc.returncode == 0, proc.stderr
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in copies} == before


@pytest.mark.quick
def test_each_block_is_filled_in_the_file_that_holds_it(tmp_path):
    # catches: every block spliced into the first file named; the text around a block lost
    one, two = tmp_path / "one.md", tmp_path / "two.md"
    one.write_text("# one\n<!-- a:start -->\nold a\n<!-- a:end -->\ntail\n")
    two.write_text("# two\n<!-- b:start -->\n<!-- b:end -->\n")
    (tmp_path / "a.txt").write_text("new a\n")
    (tmp_path / "b.txt").write_text("| new | b |\n")
    proc = run_script("update_readme.py", one, two, f"b={tmp_path / 'b.txt'}", f"a={tmp_path / 'a.txt'}")
    assert proc.returncode == 0, proc.stderr
    assert one.read_text() == "# one\n<!-- a:start -->\nnew a\n<!-- a:end -->\ntail\n"
    assert two.read_text() == "# two\n<!-- b:start -->\n| new | b |\n<!-- b:end -->\n"


@pytest.mark.quick
def test_a_block_found_nowhere_or_twice_is_one_line_and_changes_no_file(tmp_path):
    # catches: a block silently skipped, or filled in one file while its copy in another goes stale; a half-made
    # run that filled the first block before refusing the second
    one, two = tmp_path / "one.md", tmp_path / "two.md"
    one.write_text("<!-- a:start -->\nold a\n<!-- a:end -->\n<!-- b:start -->\n<!-- b:end -->\n")
    two.write_text("<!-- b:start -->\n<!-- b:end -->\n<!-- c:start -->\n")
    (tmp_path / "new.txt").write_text("new\n")
    new = tmp_path / "new.txt"
    for blocks, says in [
        ([f"a={new}", f"z={new}"], "block 'z': no <!-- z:start -->"),
        ([f"a={new}", f"b={new}"], f"block 'b' is in {one} and {two}"),
        ([f"a={new}", f"c={new}"], f"{two}: block 'c' needs one <!-- c:start --> and one <!-- c:end -->"),
        ([f"a={new}", f"a={new}"], "a block named twice"),
        ([f"a={tmp_path / 'missing.txt'}"], "expected BLOCK=FILE with an existing FILE"),
    ]:
        before = (one.read_bytes(), two.read_bytes())
        proc = run_script("update_readme.py", one, two, *blocks)
        assert proc.returncode == 2 and says in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
        assert (one.read_bytes(), two.read_bytes()) == before
