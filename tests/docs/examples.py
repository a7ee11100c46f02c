"""The code examples of README.md and docs/*.md, as tests/docs/test_examples.py runs them.

Every fenced block whose language is `python` or `bash` runs, page by page and in the order of
the page, unless the line just above its fence is a comment saying why it cannot:

    <!-- notest: needs an S3 bucket and its credentials -->

(invisible on GitHub and in the built site). Other languages (`text`, the output of a command)
are shown, not run. Python blocks of one page share one namespace, as a notebook's cells do.
A `print(...)` on a line of its own with a comment after it,
`print(x)   # [b'hello']`, says what it prints: the test checks that it printed exactly that.
Bash blocks are not given to a shell: this module runs the commands the docs use, in the test's
own process (a `deltabus` command starts in a second or two in-process, ten or more as a
process of its own on a loaded machine): `deltabus ...` with its exit code checked, a `printf
'...' |` in front of one as its standard input, and `cat > FILE <<'EOF'` ... `EOF`. Anything else
fails the test, naming the line, so a block is either run or marked with its reason.

The docs show the addresses of `make run`'s cluster; ADDRESSES lists what the tests replace them
with (the test cluster's), and nothing else in an example is changed.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
RUN = ("python", "bash")  # the languages whose blocks run
SHOWN = ("text", "json", "properties", "protobuf", "yaml")  # shown, not run
# `make run`'s addresses, in the docs, and the default checkpoint folder of the Spark examples:
# the test puts its cluster's and a folder of its own in their place.
ADDRESSES = ("http://127.0.0.1:8081", "127.0.0.1:9192", "127.0.0.1:9092")

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
NOTEST = re.compile(r"^\s*<!--\s*notest:\s*(?P<reason>.*?)\s*-->\s*$")
PRINT = re.compile(r"^\s*print\(.*\)\s*#\s?(?P<expected>.*?)\s*$")
HEREDOC = re.compile(r"^cat > (?P<path>\S+) <<\s*'?(?P<end>\w+)'?\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its code (unindented), and why it does not
    run, if the page says so."""

    page: Path
    line: int  # the opening fence's line, from 1
    language: str
    code: str
    notest: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.language in RUN and self.notest is None


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a Markdown page, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        end = i + 1
        while end < len(lines) and not _closes(lines[end], fence):
            end += 1
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip()
                for line in lines[i + 1:end]]
        above = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        marked = NOTEST.match(above)
        found.append(Block(page, i + 1, (opening["info"].split() or [""])[0],
                           "\n".join(body) + "\n", marked["reason"] if marked else None))
        i = end + 1
    return found


def _closes(line: str, fence: str) -> bool:
    stripped = line.strip()
    return stripped.startswith(fence) and not stripped.strip(fence[0])


def localized(code: str, addresses: Mapping[str, str]) -> str:
    """The example with the docs' addresses (ADDRESSES) replaced by the test's."""
    for default in ADDRESSES:
        code = code.replace(default, addresses[default])
    return code


def python_source(block: Block, code: str) -> str:
    """The block's code, pushed down so that a traceback's line numbers are the page's."""
    return "\n" * block.line + code


def expected_prints(block: Block) -> dict[int, str]:
    """What the block's commented `print(...)` lines say they print, by their line on the page."""
    return {block.line + n: printed["expected"]
            for n, line in enumerate(block.code.splitlines(), 1) if (printed := PRINT.match(line))}


class Prints:
    """`print` for the examples: prints, and keeps what each line of `filename` printed first."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.by_line: dict[int, str] = {}

    def __call__(self, *values: object, sep: str | None = " ", end: str | None = "\n",
                 **kwargs: Any) -> None:
        print(*values, sep=sep, end=end, **kwargs)
        caller = sys._getframe(1)
        if caller.f_code.co_filename == self.filename:
            self.by_line.setdefault(caller.f_lineno, (sep or " ").join(map(str, values)))

    def check(self, block: Block) -> None:
        """Each commented print of the block printed what its comment says."""
        for line, expected in expected_prints(block).items():
            assert line in self.by_line, f"{block.page.name}:{line}: never printed"
            assert self.by_line[line] == expected, (
                f"{block.page.name}:{line}: printed {self.by_line[line]!r}, "
                f"the page says {expected!r}")


# ---- bash ----------------------------------------------------------------------------------


class Unsupported(Exception):
    """A bash line the runner does not run: mark its block `<!-- notest: why -->` instead."""


@dataclass(frozen=True)
class Deltabus:
    """`deltabus ARGS`, with this standard input (None: none)."""

    argv: tuple[str, ...]
    stdin: str | None
    text: str


@dataclass(frozen=True)
class WriteFile:
    """`cat > PATH <<'EOF'` ... `EOF`."""

    path: str
    content: str
    text: str


Command = Deltabus | WriteFile


def commands(code: str) -> Iterator[Command]:
    """The commands of a bash block, continuation lines joined and comments left out."""
    lines = code.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        heredoc = HEREDOC.match(line)
        if heredoc:
            end = lines.index(heredoc["end"], i)
            yield WriteFile(heredoc["path"], "\n".join(lines[i:end]) + "\n", line)
            i = end + 1
            continue
        text = line
        while text.rstrip().endswith("\\") and i < len(lines):
            text = text.rstrip()[:-1] + " " + lines[i].strip()
            i += 1
        yield _deltabus(text)


def _deltabus(text: str) -> Deltabus:
    words = shlex.split(text, comments=True)
    stdin = None
    if "|" in words:
        bar = words.index("|")
        left, words = words[:bar], words[bar + 1:]
        if len(left) != 2 or left[0] != "printf":
            raise Unsupported(f"only `printf '...' | deltabus ...` is piped here: {text}")
        stdin = _printf(left[1])
    if words[:1] != ["deltabus"]:
        raise Unsupported(f"not a deltabus command: {text}")
    if words[1:3] == ["cluster", "start"]:
        raise Unsupported(f"starts a cluster of its own: {text}")
    return Deltabus(tuple(words[1:]), stdin, text)


def _printf(template: str) -> str:
    if "%" in template.replace("%%", ""):
        raise Unsupported(f"printf with a format: {template}")
    return (template.replace("%%", "%").replace("\\n", "\n").replace("\\t", "\t")
            .replace("\\\\", "\\"))


def run_bash(code: str, deltabus: Callable[[list[str], str | None], tuple[int, str, str]],
             cwd: Path) -> list[str]:
    """Run a bash block: each `deltabus` command through `deltabus(argv, stdin)`, which returns
    (exit code, stdout, stderr); files written under `cwd`. Returns a transcript; raises
    AssertionError, with the transcript, at the first command that does not exit 0."""
    transcript: list[str] = []
    for command in commands(code):
        transcript.append(f"$ {command.text}")
        if isinstance(command, WriteFile):
            (cwd / command.path).write_text(command.content, encoding="utf-8")
            continue
        rc, out, err = deltabus(list(command.argv), command.stdin)
        transcript += [out.rstrip(), err.rstrip()]
        if rc != 0:
            raise AssertionError(f"exit {rc}:\n" + "\n".join(t for t in transcript if t))
    return transcript
