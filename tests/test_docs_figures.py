"""The figures the docs quote come from one place, or are checked against it here.

- the test count (``~N tests``) is within 10% of what pytest collects;
- a first run's time, where a page marks it (``<!-- demo-time -->``), is the total of
  :data:`pipelines.run.expected.FIRST_RUNS`;
- every exit code a page quotes is one of docs/exit-codes.md's, and "exit 2" is never said of
  a service that does not answer (that is 3);
- docs/configuration.md's table of configs lists exactly the files in configs/ and
  configs/targets/.
(tests/test_docs.py checks the commands, links and make targets.)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.run.expected import FIRST_RUNS
from tests.test_docs import ROOT, doc_files, prose_lines

TESTS = ROOT / "tests"


# --- the test count -----------------------------------------------------------------------

QUOTED_COUNT = re.compile(r"~([\d,]+) tests\b")


def suite_size(session: pytest.Session) -> int:
    """Tests in the whole suite: this session's, when it collected all of tests/ with nothing
    deselected (``make test``, CI), else a ``pytest --collect-only`` of tests/ (~15 s)."""
    args = {Path(arg.split("::")[0]).resolve() for arg in session.config.args}
    option = session.config.option
    if args == {TESTS} and not option.keyword and not option.markexpr:
        return session.testscollected
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly", str(TESTS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    found = re.search(r"(\d+) tests? collected", listed.stdout)
    assert found, listed.stdout[-2000:] + listed.stderr[-2000:]
    return int(found.group(1))


def count_problems(quoted: list[tuple[str, int]], collected: int) -> list[str]:
    """Each quoted count more than 10% off ``collected``."""
    return [
        f"{where}: ~{count} tests, but pytest collects {collected}: say ~{round(collected, -1)}"
        for where, count in quoted
        if abs(count - collected) > 0.1 * collected
    ]


def quoted_counts() -> list[tuple[str, int]]:
    """(``page:line``, N) of every ``~N tests`` in the docs."""
    return [
        (f"{doc.relative_to(ROOT)}:{number}", int(match.group(1).replace(",", "")))
        for doc in doc_files()
        for number, line in enumerate(doc.read_text().splitlines(), 1)
        for match in QUOTED_COUNT.finditer(line)
    ]


def test_the_quoted_test_count_is_the_suites(request: pytest.FixtureRequest) -> None:
    quoted = quoted_counts()
    assert any(where.startswith("README.md") for where, _ in quoted), "README quotes no ~N tests"
    problems = count_problems(quoted, suite_size(request.session))
    assert not problems, "\n".join(problems)


# --- a first run's time --------------------------------------------------------------------

TIME_MARKERS = {"demo-time": "demo.yaml", "quickstart-time": "quickstart.yaml"}
"""A page's marker -> the shipped config whose first run it quotes."""
MINUTES = re.compile(r"(\d+(?:\.\d+)?) min")


def time_problems(name: str, text: str) -> list[str]:
    """Each marked time that is not its config's :data:`FIRST_RUNS` total (whole minutes):
    the figure is the first ``N min`` on the marker's line, after the marker."""
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        for marker, config in TIME_MARKERS.items():
            at = line.find(f"<!-- {marker} -->")
            if at < 0:
                continue
            wanted = FIRST_RUNS[config].minutes()
            found = MINUTES.search(line, at)
            if found is None or float(found.group(1)) != wanted:
                shown = found.group(0) if found else "no N min"
                problems.append(
                    f"{name}:{number}: {marker} says {shown!r}; pipelines/run/expected.py's "
                    f"first run of {config} takes {wanted} min"
                )
    return problems


def test_the_quoted_first_run_times_are_the_measured_ones() -> None:
    texts = {doc.relative_to(ROOT).as_posix(): doc.read_text() for doc in doc_files()}
    for marker in TIME_MARKERS:
        assert f"<!-- {marker} -->" in texts["README.md"], f"README marks no {marker}"
    problems = [p for name, text in texts.items() for p in time_problems(name, text)]
    assert not problems, "\n".join(problems)


# --- exit codes ----------------------------------------------------------------------------

EXIT_MENTION = re.compile(r"\b[Ee]xits? (\d+)\b")
NOT_ANSWERING = ("unreachable", "does not answer", "cannot be reached", "is down")
"""What docs/exit-codes.md's 3 covers: a service that does not answer."""


def contract_codes() -> set[int]:
    """The codes of docs/exit-codes.md's table."""
    text = (ROOT / "docs" / "exit-codes.md").read_text()
    return {int(code) for code in re.findall(r"^\|\s*(\d+)\s*\|", text, re.MULTILINE)}


def exit_problems(name: str, text: str, codes: set[int]) -> list[str]:
    """Codes outside the contract, and an ``exit 2`` whose words since the paragraph's start
    (or the previous exit code) are about a service that does not answer."""
    problems = []
    paragraph = ""
    for number, line in prose_lines(text):
        paragraph = "" if not line.strip() or line.lstrip().startswith("- ") else paragraph
        start = 0
        for mention in EXIT_MENTION.finditer(line):
            code = int(mention.group(1))
            said = (paragraph + " " + line[start : mention.start()]).lower()
            paragraph, start = "", mention.end()
            if code not in codes:
                problems.append(f"{name}:{number}: exit {code} is not in docs/exit-codes.md")
            elif code == 2 and any(re.search(rf"\b{words}\b", said) for words in NOT_ANSWERING):
                problems.append(
                    f"{name}:{number}: exit 2 for a service that does not answer: "
                    "docs/exit-codes.md says 3"
                )
        paragraph += " " + line[start:]
    return problems


def test_the_exit_codes_the_docs_quote_are_the_contracts() -> None:
    codes = contract_codes()
    assert codes == {0, 1, 2, 3, 130, 143}, codes
    problems = [
        problem
        for doc in doc_files()
        for problem in exit_problems(doc.name, doc.read_text(), codes)
    ]
    assert not problems, "\n".join(problems)


# --- the table of configs ------------------------------------------------------------------


def config_table_problems(text: str) -> list[str]:
    """What configuration.md's table of configs names that configs/ does not hold, or leaves
    out: ``configs/X.yaml`` for each pipeline config, and each target profile by name in the
    ``configs/targets/*.yaml`` row."""
    rows = [line for line in text.splitlines() if line.startswith("| `configs/")]
    named = set(re.findall(r"`(configs/[\w.-]+\.yaml)`", "\n".join(rows)))
    targets = [row for row in rows if row.startswith("| `configs/targets/*.yaml`")]
    profiles = set(re.findall(r"`([\w-]+)`", targets[0])) if targets else set()
    shipped = {f"configs/{p.name}" for p in (ROOT / "configs").glob("*.yaml")}
    profiles_shipped = {p.stem for p in (ROOT / "configs" / "targets").glob("*.yaml")}
    return [
        *(f"configuration.md lists {c}, which configs/ does not hold" for c in named - shipped),
        *(f"configuration.md's table leaves out {c}" for c in sorted(shipped - named)),
        *(f"configuration.md names target {t}: not shipped" for t in profiles - profiles_shipped),
        *(f"configuration.md's targets row leaves out {t}" for t in profiles_shipped - profiles),
    ]


def test_the_config_table_lists_every_shipped_config() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    problems = config_table_problems(text)
    assert not problems, "\n".join(problems)


# --- the checks catch what they are for ----------------------------------------------------


def test_the_figure_checks_catch_drift() -> None:
    """A count 10% off, a time that is not the measured one, exit 2 for an unreachable server,
    an unknown code and a table without a shipped config are each reported."""
    assert count_problems([("README.md:1", 590)], 746) and not count_problems([("x", 750)], 746)
    demo = FIRST_RUNS["demo.yaml"].minutes()
    assert time_problems("x.md", f"| about {demo + 5} min <!-- demo-time --> |")
    assert not time_problems("x.md", f"| <!-- demo-time --> about {demo} min |")
    stale = "- **An unreachable server, a bad token**: checked first, exit 2.\n\nIt exits 4.\n"
    assert len(exit_problems("x.md", stale, contract_codes())) == 2
    fixed = "- **A server that does not answer**: exit 3. **A bad token**: exit 2.\n"
    assert exit_problems("x.md", fixed, contract_codes()) == []
    table = "| `configs/demo.yaml` | the demo |\n| `configs/targets/*.yaml` | `local-cpu` |\n"
    problems = config_table_problems(table)
    assert "configuration.md's table leaves out configs/tiny.yaml" in problems
    assert "configuration.md's targets row leaves out local-cpu-async" in problems
