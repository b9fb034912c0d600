"""The README is a front door and the docs stay inside the repository.

- README.md is short (at most 220 lines) and starts with the two set-up commands, `make demo` before
  `make test`;
- every relative markdown link in README.md and docs/**/*.md resolves to a file of the repository, and to a
  heading of it when the link has an #anchor (GitHub's slug rules);
- no markdown link leaves the repository: no http(s) link, no absolute path, no path above the root;
- the README's Python example runs and prints what the README shows;
- the CLI reference names every command and flag that `edgemux --help` has, and each command's section has the
  parser's usage line and one table row per flag of that command, no other;
- every ``EDGEMUX_*`` variable named in src/edgemux is in the CLI reference's environment table, and no other;
- docs/experiments.md's table names every registered experiment, and no other;
- every `edgemux` command line of a ```bash or ```console block (console: its `$ ` lines) in README.md and
  docs/**/*.md names a verb and only flags of that verb; a block after `<!-- run ... -->` is run and exits 0;
- docs/results.md names commands, not commits or sessions, as the source of a figure;
- every test a page cites as ``tests/FILE.py::test_name`` exists.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import unicodedata
from dataclasses import dataclass
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


def _section(page: str, name: str) -> str:
    """The text of the CLI reference's section for command ``name`` (up to the next heading)."""
    return page.split(f"`{name}`\n", 1)[1].split("\n#", 1)[0]


def _usage(parser: argparse.ArgumentParser) -> str:
    """The parser's usage line without `usage: ` and `[-h]`, whitespace collapsed."""
    return " ".join(parser.format_usage().split()).removeprefix("usage: ").replace(" [-h]", "")


FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def cli_reference_problems(page: str, commands: list[tuple[str, argparse.ArgumentParser]]) -> list[str]:
    """Where the CLI reference's sections disagree with the parser: the usage block, and the table's flag rows
    against the command's flags (a flag documented under the wrong command is caught both ways)."""
    problems = []
    for name, parser in commands:
        if f"`{name}`\n" not in page:
            problems.append(f"no section for `{name}`")
            continue
        section = _section(page, name)
        m = re.search(r"```\n(.*?)\n```", section, re.S)
        usage = " ".join(m.group(1).split()) if m else None
        if usage != _usage(parser):
            problems.append(f"`{name}`: the usage block says {usage!r}, `--help` says {_usage(parser)!r}")
        rows = {f for first in re.findall(r"^\| `([^`]*)` \|", section, re.M) for f in FLAG.findall(first)}
        flags = {f for a in parser._actions for f in a.option_strings if f not in ("-h", "--help")}
        for f in sorted(rows - flags):
            problems.append(f"`{name}`: the table has a row for {f}, which `{name} --help` does not have")
        for f in sorted(flags - rows):
            problems.append(f"`{name}`: no table row for {f}")
    return problems


def test_cli_reference_sections_match_the_parser() -> None:
    page = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    problems = cli_reference_problems(page, _commands(build_parser(), "edgemux")[1:])
    assert not problems, "docs/reference/cli.md disagrees with the parser:\n" + "\n".join(problems)


def test_cli_reference_check_can_fail() -> None:
    p = argparse.ArgumentParser(prog="edgemux x")
    p.add_argument("--a", metavar="A")
    good = "## `edgemux x`\n\n```\nedgemux x [--a A]\n```\n\n| argument | meaning |\n|---|---|\n| `--a A` | a |\n"
    assert cli_reference_problems(good, [("edgemux x", p)]) == []
    moved = good.replace("| `--a A` | a |\n", "| `--b S` | b |\n")
    assert cli_reference_problems(moved, [("edgemux x", p)]) == [
        "`edgemux x`: the table has a row for --b, which `edgemux x --help` does not have",
        "`edgemux x`: no table row for --a"]
    assert "usage block" in cli_reference_problems(good.replace("[--a A]", "[--a B]"), [("edgemux x", p)])[0]


# ---------------------------------------------------------------------------------- environment variables

ENV_VAR = re.compile(r"\bEDGEMUX_[A-Z0-9_]*[A-Z0-9]\b")


def env_vars_in_source() -> set[str]:
    return {v for f in (ROOT / "src" / "edgemux").rglob("*.py") for v in ENV_VAR.findall(f.read_text(encoding="utf-8"))}


def env_vars_documented() -> set[str]:
    """The first column of the CLI reference's environment table."""
    page = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    section = page.split("\n## Environment variables\n", 1)[1].split("\n## ", 1)[0]
    return {v for first in re.findall(r"^\| `([^`]*)` \|", section, re.M) for v in ENV_VAR.findall(first)}


def env_problems(read: set[str], documented: set[str]) -> list[str]:
    return ([f"{v} is read in src/edgemux but not in docs/reference/cli.md#environment-variables"
             for v in sorted(read - documented)]
            + [f"{v} is documented but src/edgemux never names it" for v in sorted(documented - read)])


def test_every_environment_variable_is_documented() -> None:
    read = env_vars_in_source()
    assert {"EDGEMUX_SERVER", "EDGEMUX_TOKEN", "EDGEMUX_APP_KEY"} <= read  # the scan sees the source
    assert env_problems(read, env_vars_documented()) == []


def test_environment_check_can_fail() -> None:
    assert ENV_VAR.findall('os.environ.get("EDGEMUX_NEW_THING") or EDGEMUX_ alone') == ["EDGEMUX_NEW_THING"]
    assert env_problems({"EDGEMUX_A", "EDGEMUX_B"}, {"EDGEMUX_A", "EDGEMUX_C"}) == [
        "EDGEMUX_B is read in src/edgemux but not in docs/reference/cli.md#environment-variables",
        "EDGEMUX_C is documented but src/edgemux never names it"]


# ------------------------------------------------------------------------------------------- experiments


def test_experiments_page_names_every_experiment() -> None:
    from edgemux.experiments.registry import names

    page = (ROOT / "docs" / "experiments.md").read_text(encoding="utf-8")
    table = set(re.findall(r"^\| `([a-z0-9-]+)` \|", page, re.M))
    registered = set(names())
    assert len(registered) >= 14
    assert registered - table == set(), "docs/experiments.md's table misses these experiments"
    assert table - registered == set(), "docs/experiments.md's table names experiments that are not registered"


# ------------------------------------------------------------------------------------- command examples

FENCE_LANG = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
RUN_MARK = re.compile(r"^\s*<!--\s*run\b")
COMMAND_LANGS = ("bash", "console")
PREFIXES = ("edgemux ", ".venv/bin/edgemux ", "python -m edgemux ")
SHELL_OPS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1"}


@dataclass(frozen=True)
class Example:
    """One `edgemux` command line of a page's command block; ``run``: its block is marked to run."""

    page: Path
    line: int
    text: str
    run: bool

    def id(self) -> str:
        return f"{_rel(self.page)}:{self.line}"


def command_examples(path: Path) -> list[Example]:
    """The `edgemux` command lines of the ```bash and ```console blocks of a markdown file: in a bash block every
    line (``\\`` continuations joined), in a console block the `$ ` lines, that start with `edgemux `."""
    out: list[Example] = []
    lang, run, prev, start, pending = None, False, "", 0, ""
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        m = FENCE_LANG.match(line)
        if m:
            if lang is None:
                lang, run = m.group(2) or "", bool(RUN_MARK.match(prev))
            else:
                lang, pending = None, ""
            prev = line
            continue
        if lang is not None and lang in COMMAND_LANGS:
            text = line.strip()
            if lang == "console" and not pending:
                if not text.startswith("$ "):
                    continue
                text = text[2:]
            if not pending:
                start = n
            if text.endswith("\\"):
                pending += text[:-1] + " "
                continue
            text, pending = pending + text, ""
            if text.startswith(PREFIXES):
                out.append(Example(path, start, text, run))
        if line.strip():
            prev = line
    return out


def _words(text: str) -> list[str]:
    """A command line's words after `edgemux`, up to a pipe, redirection or comment."""
    lex = shlex.shlex(text, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    words = []
    for w in lex:
        if w in SHELL_OPS:
            break
        words.append(w)
    for prefix in PREFIXES:
        head = prefix.split()
        if words[:len(head)] == head:
            return words[len(head):]
    raise AssertionError(f"not an edgemux command: {text!r}")


def command_problems(text: str, parser: argparse.ArgumentParser) -> list[str]:
    """Why a command line does not fit the parser: an unknown verb, or a flag its verb does not have."""
    words, verb = _words(text), ["edgemux"]
    while True:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or not words or words[0].startswith("-"):
            if sub is not None and not (words and words[0] in ("-h", "--help", "--version")):
                return [f"`{' '.join(verb)}` needs one of: {', '.join(sub.choices)}"]
            break
        if words[0] not in sub.choices:
            return [f"`{' '.join(verb)}` has no verb {words[0]!r}"]
        parser = sub.choices[words[0]]
        verb.append(words.pop(0))
    flags = {f for a in parser._actions for f in a.option_strings}
    problems = []
    for w in words:
        if re.match(r"^--?[A-Za-z]", w):
            flag = w.split("=", 1)[0]
            if flag not in flags:
                problems.append(f"`{' '.join(verb)}` has no flag {flag}")
    return problems


EXAMPLES = [e for page in PAGES for e in command_examples(page)]


def test_command_examples_fit_the_parser() -> None:
    assert len(EXAMPLES) >= 10, "the pages' command blocks were not found"
    parser = build_parser()
    problems = [f"{e.id()}: {p}: {e.text}" for e in EXAMPLES for p in command_problems(e.text, parser)]
    assert not problems, "command examples that `edgemux` would refuse:\n" + "\n".join(problems)


@pytest.fixture(scope="module")
def root_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository root as links, without out/: an example that writes out/ writes it here."""
    copy = tmp_path_factory.mktemp("root")
    for entry in ROOT.iterdir():
        if entry.name not in ("out", ".git"):
            (copy / entry.name).symlink_to(entry)
    return copy


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.run], ids=Example.id)
def test_marked_command_examples_run(example: Example, root_copy: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEMUX_")}
    out = subprocess.run([sys.executable, "-m", "edgemux", *_words(example.text)], cwd=root_copy, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{example.id()}: `{example.text}` exited {out.returncode}:\n{out.stderr[-2000:]}"


def test_command_example_check_can_fail(tmp_path: Path) -> None:
    md = tmp_path / "x.md"
    md.write_text("<!-- run -->\n```bash\nedgemux profiles list --kind edgetpu   # a comment --not-a-flag\n"
                  "edgemux place --cluster c.yaml \\\n   --apps a.yaml --policy ibis | head\n```\n"
                  "```console\n$ edgemux predict --made-up s.yaml\nedgemux: error: not a command\n```\n"
                  "```\nedgemux nonsense --ignored\n```\n```bash\nedgemux frobnicate\nmake demo\n```\n",
                  encoding="utf-8")
    found = command_examples(md)
    assert [(e.line, e.run) for e in found] == [(3, True), (4, True), (8, False), (15, False)]
    assert found[1].text == "edgemux place --cluster c.yaml  --apps a.yaml --policy ibis | head"
    parser = build_parser()
    assert command_problems(found[0].text, parser) == []
    assert command_problems(found[1].text, parser) == []
    assert command_problems(found[2].text, parser) == ["`edgemux predict` has no flag --made-up"]
    assert command_problems(found[3].text, parser) == ["`edgemux` has no verb 'frobnicate'"]
    assert command_problems("edgemux profiles --json", parser)[0].startswith("`edgemux profiles` needs one of")
    assert command_problems("edgemux up --no-auth --agent-arg cpu-1=--threads=2 --help", parser) == []
    assert command_problems("edgemux agent --reconcile-period-s 1", parser) == [
        "`edgemux agent` has no flag --reconcile-period-s"]


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
