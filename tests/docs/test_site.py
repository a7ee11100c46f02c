"""The documentation as `make docs` builds it: mkdocs in strict mode (mkdocs.yml), so a broken
link or anchor, a page missing from the navigation or a navigation entry without its page fails
the suite, with mkdocs's own line naming it. Beside it, what mkdocs does not see: the README's
links into docs/, absolute paths a reader could not follow, and the performance page, which
`make bench` writes rather than a person.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from markdown.extensions.toc import slugify

from bench.performance_page import MARKER

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (?P<title>.+?)\s*$")
# An absolute path in the text: after a space, quote, bracket or `=`, not inside a URL.
ABSOLUTE_PATH = re.compile(r"(?:^|(?<=[\s`'\"(=]))/[A-Za-z][\w.-]*(?:/[\w.{}*-]*)*")
# The absolute paths the docs may show, none of which a reader needs from this machine: a folder
# of the reader's choosing, Databricks' mounts, the sample output of `make run`, and the HTTP
# paths of the schema registry's REST API and of Kafka's quota entities.
ALLOWED_PATHS = ("/tmp/", "/Volumes/", "/dbfs", "/home/me/", "/subjects/", "/schemas/",
                 "/config", "/compatibility/",
                 # the metrics and console doors' URL paths
                 "/sd", "/metrics", "/api/overview")


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
         "--site-dir", str(site)], capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_with_strict_checks(tmp_path: Path) -> None:
    built = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "kafka-compatibility" / "index.html").is_file()


def test_a_broken_link_a_missing_anchor_and_a_missing_page_fail_the_build(
        tmp_path: Path) -> None:
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    with (tmp_path / "docs" / "architecture.md").open("a", encoding="utf-8") as page:
        page.write("\nSee [the page](no-such-page.md) and [a section](security.md#no-such).\n")
    (tmp_path / "docs" / "delivery-guarantees.md").unlink()  # still in the navigation
    built = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    output = built.stdout + built.stderr
    assert built.returncode != 0, output
    assert "contains a link 'no-such-page.md', but the target is not found" in output
    assert "does not contain an anchor '#no-such'" in output
    assert "'delivery-guarantees.md'" in output and "not found" in output


def test_the_readmes_links_reach_their_pages_and_sections() -> None:
    for target in LINK.findall((ROOT / "README.md").read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), f"README.md links to {target}: no such file"
        if anchor:
            assert anchor in anchors(ROOT / path), f"README.md links to {target}: no section"


def anchors(page: Path) -> set[str]:
    """The section anchors mkdocs gives a page's headings (Python-Markdown's toc)."""
    fenced = False
    found = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        heading = None if fenced else HEADING.match(line)
        if heading:
            found.add(slugify(heading["title"].replace("`", ""), "-"))
    return found


def test_no_page_names_a_path_outside_the_repository() -> None:
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for number, line in enumerate(text.splitlines(), 1):
            for path in ABSOLUTE_PATH.findall(line):
                assert path.startswith(ALLOWED_PATHS), f"{page.name}:{number}: {path}"


def test_the_performance_page_is_written_by_make_bench() -> None:
    page = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    assert MARKER in page.splitlines()[:4], "docs/performance.md: `make bench` writes it"
