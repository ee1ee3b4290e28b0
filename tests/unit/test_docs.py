"""The docs tell the truth: exit codes, --help and the nav are checked against the code.

`make test` also builds the site with `mkdocs build --strict`, which fails on a broken
link or anchor; these tests catch what a link check cannot.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpuenv.cli.tree import main
from gpuenv.errors import COMMAND_EXIT_NOTE, EXIT_CODES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
EXIT_CODE_PAGE = DOCS / "reference" / "exit-codes.md"
# A command's own exit codes that the docs mention (they are not gpuenv's):
# 127 command not found, 137 killed (SIGKILL, out of memory), 143 stopped (SIGTERM).
COMMAND_CODES = {127, 137, 143}

Rows = list[tuple[int, str]]


def exit_code_tables(text: str) -> list[Rows]:
    """Every Markdown table whose header is `| code | meaning |`, as (code, meaning) rows."""
    tables: list[Rows] = []
    lines = text.splitlines()
    for number, line in enumerate(lines):
        if cells(line) != ["code", "meaning"]:
            continue
        rows: Rows = []
        for row in lines[number + 2 :]:
            if not row.startswith("|"):
                break
            code, meaning = cells(row)
            rows.append((int(code), meaning))
        tables.append(rows)
    return tables


def cells(line: str) -> list[str]:
    """The cells of one Markdown table row (an escaped `\\|` stays in its cell)."""
    if not line.startswith("|"):
        return []
    parts = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [part.strip().replace("\\|", "|") for part in parts]


def differences(rows: Rows) -> list[str]:
    """What a documented exit-code table gets wrong, compared with EXIT_CODES."""
    want = {entry.code: entry.meaning for entry in EXIT_CODES}
    have = dict(rows)
    problems = [f"{code}: missing" for code in want if code not in have]
    problems += [f"{code}: not an exit code gpuenv has" for code in have if code not in want]
    problems += [
        f"{code}: {have[code]!r} should be {want[code]!r}"
        for code in want
        if code in have and have[code] != want[code]
    ]
    if not problems and [code for code, _ in rows] != list(want):
        problems.append("the rows are not in the order of EXIT_CODES")
    return problems


def test_the_exit_code_page_matches_exit_codes() -> None:
    text = EXIT_CODE_PAGE.read_text()
    tables = exit_code_tables(text)
    assert len(tables) == 1, f"{EXIT_CODE_PAGE.name} should hold one `| code | meaning |` table"
    assert differences(tables[0]) == [], "update docs/reference/exit-codes.md from EXIT_CODES"
    assert COMMAND_EXIT_NOTE in text


def test_an_exit_code_table_in_the_readme_matches_too() -> None:
    text = README.read_text()
    for rows in exit_code_tables(text):
        assert differences(rows) == []
    assert "docs/reference/exit-codes.md" in text


@pytest.mark.parametrize(
    ("page", "problem"),
    [
        ("| 0 | success |\n| 1 | oops |", "1: 'oops' should be"),
        ("| 0 | success |", "1: missing"),
        ("| 0 | success |\n| 99 | nine |", "99: not an exit code gpuenv has"),
    ],
    ids=["changed meaning", "missing code", "unknown code"],
)
def test_a_wrong_table_is_caught(page: str, problem: str) -> None:
    full = [(entry.code, entry.meaning) for entry in EXIT_CODES]
    body = "\n".join(f"| {code} | {meaning} |" for code, meaning in full[2:])
    [rows] = exit_code_tables(f"| code | meaning |\n| --- | --- |\n{page}\n{body}\n")
    assert any(problem in line for line in differences(rows))


def test_a_reordered_table_is_caught() -> None:
    rows = [(entry.code, entry.meaning) for entry in reversed(EXIT_CODES)]
    assert differences(rows) == ["the rows are not in the order of EXIT_CODES"]


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_exit_codes_mentioned_in_prose_exist(path: Path) -> None:
    known = {entry.code for entry in EXIT_CODES} | COMMAND_CODES
    mentioned = re.findall(r"exits? (?:with )?code (\d+)", path.read_text())
    assert {int(code) for code in mentioned} <= known


def nav_pages(nav: object) -> list[str]:
    """The page paths in an mkdocs `nav`, however deeply its sections nest."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return []


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = nav_pages(config["nav"])
    pages = sorted(str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md"))
    assert sorted(listed) == pages
    assert len(listed) == len(set(listed)), "a page is listed twice in nav"


def test_the_help_on_the_home_page_is_what_gpuenv_prints() -> None:
    """docs/index.md shows `gpuenv --help`; regenerate it with COLUMNS=100 gpuenv --help."""
    match = re.search(
        r"```console\n\$ gpuenv --help\n(.*?)```", (DOCS / "index.md").read_text(), re.S
    )
    assert match, "docs/index.md should show `$ gpuenv --help` in a console block"
    # Help is at most 80 columns wide; click leaves 2 of them free.
    result = CliRunner().invoke(main, ["--help"], prog_name="gpuenv", terminal_width=78)
    assert result.exit_code == 0
    assert match.group(1) == result.output


def test_the_readme_stays_short_and_its_links_resolve() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 300, "the reference belongs in docs/, not the README"
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
