"""The README is a front door and the docs stay inside the repository.

- README.md is short (at most 220 lines) and starts with the two set-up commands, `make demo` before
  `make test`;
- every relative markdown link in README.md and docs/**/*.md resolves to a file of the repository, and to a
  heading of it when the link has an #anchor (GitHub's slug rules);
- no markdown link leaves the repository: no http(s) link, no absolute path, no path above the root;
- the README's Python example runs and prints what the README shows;
- the CLI reference names every command and flag that `edgemux --help` has;
- docs/results.md names commands, not commits or sessions, as the source of a figure;
- every test a page cites as ``tests/FILE.py::test_name`` exists.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import unicodedata
from functools import cache
from pathlib import Path

import pytest

from edgemux.cli.main import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target); the text may hold one level of brackets
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
AUTOLINK = re.compile(r"<((?:https?|ftp)://[^>\s]+)>")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks, with inline code spans blanked."""
    out, fenced = [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)))
    return out


def _links(path: Path) -> list[tuple[int, str]]:
    """Every link target of a markdown file (inline, reference definitions, autolinks), outside code."""
    found = []
    for n, line in _prose_lines(path):
        found += [(n, m.group(1)) for m in INLINE_LINK.finditer(line)]
        found += [(n, m.group(1)) for m in AUTOLINK.finditer(line)]
        m = REFERENCE_DEF.match(line)
        if m:
            found.append((n, m.group(1)))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower case, without punctuation (letters, marks,
    digits, underscores, spaces and hyphens stay), spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)      # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)                             # inline HTML
    text = text.replace("`", "").replace("*", "").lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LMN")
    return kept.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The heading anchors of a markdown file; a repeated slug gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            base = slug(m.group(2))
            k = seen.get(base, 0)
            out.add(base if k == 0 else f"{base}-{k}")
            seen[base] = k + 1
    return frozenset(out)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ------------------------------------------------------------------------------------------ front door


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 220, f"README.md has {len(lines)} lines; move detail into docs/ (at most 220)"


def test_setup_commands_come_first() -> None:
    head = README.read_text(encoding="utf-8").splitlines()[:30]
    demo = next((i for i, line in enumerate(head) if "make demo" in line), None)
    test = next((i for i, line in enumerate(head) if "make test" in line), None)
    assert demo is not None, "`make demo` is not in the first 30 lines of README.md"
    assert test is not None, "`make test` is not in the first 30 lines of README.md"
    assert demo < test, "`make demo` must come before `make test` in README.md"


# ---------------------------------------------------------------------------------------------- links


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_links_stay_inside_and_resolve(page: Path) -> None:
    problems = []
    for n, target in _links(page):
        where = f"{_rel(page)}:{n}: {target!r}"
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
            problems.append(f"{where} leaves the repository (a URL)")
            continue
        path_part, _, anchor = target.partition("#")
        if path_part.startswith("/"):
            problems.append(f"{where} is an absolute path")
            continue
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.is_relative_to(ROOT):
            problems.append(f"{where} points outside the repository")
            continue
        if not dest.exists():
            problems.append(f"{where} names no file of the repository")
            continue
        if anchor:
            if dest.suffix != ".md" or dest.is_dir():
                problems.append(f"{where} has an anchor into a file that is not markdown")
            elif anchor not in anchors(dest):
                problems.append(f"{where}: no heading with anchor #{anchor} in {_rel(dest)}")
    assert not problems, "\n".join(problems)


def test_pages_are_linked_from_the_readme() -> None:
    """Every docs page is reachable from the README, directly or through pages it links."""
    reached, todo = {README}, [README]
    while todo:
        page = todo.pop()
        for _, target in _links(page):
            path_part = target.partition("#")[0]
            if not path_part or ":" in path_part:
                continue
            dest = (page.parent / path_part).resolve()
            if dest.suffix == ".md" and dest.is_file() and dest not in reached:
                reached.add(dest)
                todo.append(dest)
    missing = [_rel(p) for p in PAGES if p not in reached]
    assert not missing, f"docs pages no link reaches from README.md: {missing}"


def test_link_checks_can_fail(tmp_path: Path) -> None:
    """The parsing sees links, URLs and anchors, and skips code."""
    md = tmp_path / "x.md"
    md.write_text("# A `b` (c, d)\n[x](y.md#z) [u](https://e.org) <http://e.org>\n"
                  "`[not](a-link.md)`\n```\n[not](either.md)\n# not a heading\n```\n[r]: ../up.md\n",
                  encoding="utf-8")
    assert [t for _, t in _links(md)] == ["y.md#z", "https://e.org", "http://e.org", "../up.md"]
    assert anchors(md) == frozenset({"a-b-c-d"})
    assert slug("Fig. 3–5 ≥ [the `mvsp` run](x.md)") == "fig-35--the-mvsp-run"


# ----------------------------------------------------------------------------------- README's example


def _readme_python() -> tuple[str, list[str]]:
    """The README's ```python block and the output block that follows it."""
    text = README.read_text(encoding="utf-8")
    m = re.search(r"```python\n(.*?)```\n(.*?)```\n(.*?)```", text, re.S)
    assert m, "README.md has no ```python example followed by its output"
    return m.group(1), m.group(3).splitlines()


def test_readme_python_example_runs() -> None:
    code, shown = _readme_python()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    printed = out.stdout.splitlines()
    assert len(printed) == len(shown), f"README shows {len(shown)} lines, the example prints:\n{out.stdout}"
    for want, got in zip(shown, printed):
        # a line the README shortens ends in "..."; the rest must match what was printed
        if want.endswith("..."):
            assert got.startswith(want[:-3]), f"README shows {want!r}, the example prints {got!r}"
        else:
            assert got == want, f"README shows {want!r}, the example prints {got!r}"


# --------------------------------------------------------------------------------------- CLI reference


def _commands(parser: argparse.ArgumentParser, prefix: str) -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(prefix, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _commands(sub, f"{prefix} {name}")
    return out


def test_cli_reference_names_every_command_and_flag() -> None:
    page = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    heads = set(anchors(ROOT / "docs" / "reference" / "cli.md"))
    missing = []
    for name, parser in _commands(build_parser(), "edgemux")[1:]:
        if slug(f"`{name}`") not in heads:
            missing.append(f"no section for `{name}`")
            continue
        section = page.split(f"`{name}`\n", 1)[1].split("\n#", 1)[0]
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help") and flag not in section:
                    missing.append(f"`{name}`: {flag}")
    assert not missing, "docs/reference/cli.md is missing:\n" + "\n".join(missing)


# ---------------------------------------------------------------------------------------- provenance


def test_results_name_commands_not_commits() -> None:
    text = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    for pattern in (r"\bcommit\s+[0-9a-f]{7,40}\b", r"\bat\s+[0-9a-f]{7,40}\b", r"\bthis session\b",
                    r"\b20\d\d-\d\d-\d\d\b"):
        hit = re.search(pattern, text, re.I)
        assert hit is None, f"docs/results.md: {hit.group(0)!r}: a figure names the command that printed it"


CITED_TEST = re.compile(r"tests/(test_\w+\.py)::(test_\w+)")


def test_cited_tests_exist() -> None:
    """A page that names a test as the evidence of a claim names one that is there."""
    missing = []
    for page in PAGES:
        for file, name in CITED_TEST.findall(page.read_text(encoding="utf-8")):
            test_file = ROOT / "tests" / file
            if not test_file.exists() or not re.search(rf"^def {name}\(", test_file.read_text(encoding="utf-8"), re.M):
                missing.append(f"{page.relative_to(ROOT)}: tests/{file}::{name}")
    assert missing == []


def test_cited_test_check_can_fail() -> None:
    assert CITED_TEST.findall("see tests/test_x.py::test_y and tests/test_z.py") == [("test_x.py", "test_y")]
