"""The docs name only commands that exist, and the command line has nothing the docs leave out.

Every ``robo-pipe ...`` command in README.md and docs/*.md (shell code blocks and inline code)
must name an existing verb, only options of that verb and no more arguments than it takes;
docs/cli.md must name every verb and every option. README.md fits in 200 lines, every relative
link resolves (to a heading too, where it names one) and every ``make X`` is a Makefile target.

The verbs and options come from the typer app's click command tree (what ``--help`` prints is
rendered from it), less the hidden ones (old spellings that only say what a thing is called
now); one test ties the tree to the installed ``robo-pipe`` entry point.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import typer
from typer._click.core import Command as ClickCommand  # get_command returns it

from pipelines.cli import app

ROOT = Path(__file__).resolve().parents[1]
CLI_DOC = ROOT / "docs" / "cli.md"
README_MAX_LINES = 200


def doc_files() -> list[Path]:
    """README.md and every page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


# --- the command line, from the click tree ------------------------------------------------


@dataclass(frozen=True)
class Verb:
    """One command of the tree (the root, a group such as ``models``, or a verb)."""

    path: tuple[str, ...]
    options: dict[str, bool]
    """Every option name (``--config``, ``-c``, ``--no-pace``) -> whether it takes a value."""
    option_groups: list[tuple[str, ...]]
    """The names of each option but help, together (``("--verbose", "-v")``)."""
    help_names: tuple[str, ...]
    subverbs: frozenset[str]
    max_args: int | None
    """Positional arguments it takes (None: any number)."""


def cli_verbs(cli: typer.Typer = app) -> dict[tuple[str, ...], Verb]:
    """Every command of ``robo-pipe`` (or of ``cli``) by path (``()`` is the root,
    ``("models", "show")``)."""
    verbs: dict[tuple[str, ...], Verb] = {}

    def walk(cmd: ClickCommand, path: tuple[str, ...], parent: typer.Context | None) -> None:
        # A context per level, as click makes them: help option names set on the root (or on
        # the command) apply.
        name = path[-1] if path else "robo-pipe"
        ctx = typer.Context(cmd, info_name=name, parent=parent, **cmd.context_settings)
        help_option = cmd.get_help_option(ctx)
        help_names = tuple(help_option.opts) if help_option else ()
        options: dict[str, bool] = dict.fromkeys(help_names, False)
        groups: list[tuple[str, ...]] = []
        max_args: int | None = 0
        for param in cmd.params:
            if getattr(param, "hidden", False):
                continue  # an old spelling kept to say what it is called now: not for docs
            if param.param_type_name == "option":
                names = (*param.opts, *param.secondary_opts)
                takes_value = not (param.is_flag or param.count)  # type: ignore[attr-defined]
                options.update(dict.fromkeys(names, takes_value))
                groups.append(names)
            elif max_args is not None:
                max_args = None if param.nargs == -1 else max_args + param.nargs
        subcommands = {n: c for n, c in getattr(cmd, "commands", {}).items() if not c.hidden}
        verbs[path] = Verb(path, options, groups, help_names, frozenset(subcommands), max_args)
        for name, sub in subcommands.items():
            walk(sub, (*path, name), ctx)

    walk(typer.main.get_command(cli), (), None)
    return verbs


# --- command lines in the docs ------------------------------------------------------------


@dataclass
class Command:
    """A command line found in a doc: the program (``robo-pipe`` or ``make``) and its words."""

    where: str
    program: str
    words: list[str] = field(default_factory=list)


FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
SHELL = {"", "bash", "sh", "shell", "console", "zsh"}
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
OPERATORS = {"&&", "||", "|", ";", "&", "(", ")", "$", ">", ">>", "<"}
WRAPPERS = {"time", "nohup", "exec", "sudo"}
ENV_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=\S*")
ROBO_PIPE = re.compile(r"(?:[\w.~/-]*/bin/)?robo-pipe")
REDIRECT = re.compile(r"\s\d*(?:>>?|<)\s*\S+")


def shell_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of a shell code block (continuations joined), and of
    each inline code span outside code blocks (a span may run over a line break within its
    paragraph)."""
    fence: str | None = None
    language = ""
    pending, start = "", 0
    paragraph: list[tuple[int, str]] = []
    for number, line in enumerate([*text.splitlines(), ""], 1):
        match = FENCE.match(line)
        if fence is None and (match or not line.strip()) and paragraph:
            yield from inline_spans(paragraph)
            paragraph = []
        if match and (fence is None or match.group(1).startswith(fence)):
            fence, language = (match.group(1), match.group(2)) if fence is None else (None, "")
            continue
        if fence is None:
            if line.strip():
                paragraph.append((number, line.strip()))
        elif language in SHELL:
            code = re.sub(r"(^|\s)#.*$", "", line)  # a comment
            if not pending:
                start = number
            if code.rstrip().endswith("\\"):
                pending += code.rstrip()[:-1] + " "
                continue
            yield start, pending + code
            pending = ""


def inline_spans(paragraph: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """(line number, text) of each inline code span of a paragraph's (line number, line)s."""
    starts, joined = [], ""
    for number, line in paragraph:
        starts.append((len(joined), number))
        joined += line + " "
    for span in INLINE.finditer(joined):
        yield max((s, n) for s, n in starts if s <= span.start())[1], span.group(1)


def commands_in(text: str, name: str) -> list[Command]:
    """The ``robo-pipe`` and ``make`` commands of a doc: a program at a command's start (first
    word, after variable assignments, after ``&&``, ``|``, ...), with the words up to the next
    shell operator."""
    found: list[Command] = []
    for number, line in shell_lines(text):
        lexer = shlex.shlex(REDIRECT.sub(" ", line), posix=True, punctuation_chars=";&|<>()")
        lexer.whitespace_split, lexer.commenters = True, ""
        try:
            tokens = list(lexer)
        except ValueError:  # an unbalanced quote in prose-like code
            tokens = line.split()
        current: Command | None = None
        at_start = True
        for token in tokens:
            if token in OPERATORS:
                current, at_start = None, True
            elif current is not None:
                current.words.append(token)
            elif at_start and (ENV_ASSIGNMENT.fullmatch(token) or token in WRAPPERS):
                continue
            else:
                if at_start and (ROBO_PIPE.fullmatch(token) or token == "make"):
                    program = "make" if token == "make" else "robo-pipe"
                    current = Command(f"{name}:{number}", program)
                    found.append(current)
                at_start = False
    return found


def clean(word: str) -> str:
    """A word of a synopsis without its brackets and ellipsis (``[--set`` -> ``--set``)."""
    return word.strip("[]").removesuffix("...").strip("[]")


def check_command(command: Command, verbs: dict[tuple[str, ...], Verb]) -> list[str]:
    """What is wrong with a ``robo-pipe`` command line: an unknown verb or option, or more
    positional arguments than the verb takes. Returns one message per problem."""
    words = [clean(word) for word in command.words]
    words = [word for word in words if word not in ("", "|")]
    verb, i = verbs[()], 0
    while i < len(words) and words[i] in verb.subverbs:
        verb, i = verbs[(*verb.path, words[i])], i + 1
    shown = " ".join(("robo-pipe", *command.words))
    if verb.subverbs and i < len(words) and not words[i].startswith("-"):
        name = " ".join(("robo-pipe", *verb.path))
        return [f"{command.where}: {shown!r}: {words[i]!r} is not a verb of {name!r}"]
    problems, positional = [], 0
    while i < len(words):
        word, i = words[i], i + 1
        if word.startswith("-") and word != "-":
            option, has_value, _ = word.partition("=")
            if option not in verb.options:
                name = " ".join(("robo-pipe", *verb.path))
                problems.append(f"{command.where}: {shown!r}: {name!r} has no option {option}")
            elif verb.options[option] and not has_value:
                i += 1  # the option's value
        else:
            positional += 1
    # After an unknown option, its value (if it takes one) would count as an argument.
    if not problems and verb.max_args is not None and positional > verb.max_args:
        name = " ".join(("robo-pipe", *verb.path))
        problems.append(
            f"{command.where}: {shown!r}: {positional} arguments, {name!r} takes {verb.max_args}"
        )
    return problems


def verb_of(command: Command, verbs: dict[tuple[str, ...], Verb]) -> Verb:
    """The command a (valid) ``robo-pipe`` command line runs."""
    verb = verbs[()]
    for word in map(clean, command.words):
        if word not in verb.subverbs:
            break
        verb = verbs[(*verb.path, word)]
    return verb


# --- links and make targets ---------------------------------------------------------------


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) outside code blocks, with inline code removed."""
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match and (fence is None or match.group(1).startswith(fence)):
            fence = match.group(1) if fence is None else None
            continue
        if fence is None:
            yield number, INLINE.sub("", line)


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings (lower case, punctuation dropped, spaces to
    hyphens; a repeated heading gets -1, -2, ...)."""
    found: set[str] = set()
    for _, line in prose_lines(text.replace("`", "")):
        if heading := re.match(r"#{1,6}\s+(.*?)\s*#*$", line):
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            candidate, n = slug, 0
            while candidate in found:
                n += 1
                candidate = f"{slug}-{n}"
            found.add(candidate)
    return found


def check_links(path: Path, text: str) -> list[str]:
    """Every relative link of a doc leads to a file (and to a heading where it names one)."""
    problems = []
    for number, line in prose_lines(text):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.name}:{number}: link {target!r}"
            if not linked.exists():
                problems.append(f"{where}: no file {linked}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
                problems.append(f"{where}: no heading #{anchor} in {linked.name}")
    return problems


def make_targets() -> set[str]:
    """The Makefile's targets."""
    targets: set[str] = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        if rule := re.match(r"([\w.-]+(?:[ \t]+[\w.-]+)*)[ \t]*:(?!=)", line):
            targets.update(rule.group(1).split())
    return targets


def check_make(command: Command, targets: set[str]) -> list[str]:
    """Every target a ``make`` command names exists."""
    named = [w for w in command.words if not w.startswith("-") and "=" not in w]
    return [
        f"{command.where}: make {word}: no such target" for word in named if word not in targets
    ]


# --- the tests ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def verbs() -> dict[tuple[str, ...], Verb]:
    return cli_verbs()


def all_commands() -> list[Command]:
    """Every command line of README.md and docs/*.md."""
    return [
        command
        for doc in doc_files()
        for command in commands_in(doc.read_text(), doc.relative_to(ROOT).as_posix())
    ]


def test_docs_exist() -> None:
    assert CLI_DOC.exists(), "docs/cli.md, the manual of every verb, is missing"
    assert len(doc_files()) > 2


def test_every_command_in_the_docs_exists(verbs: dict[tuple[str, ...], Verb]) -> None:
    commands = [c for c in all_commands() if c.program == "robo-pipe"]
    assert len(commands) > 50, "the docs' commands were not found"
    problems = [problem for command in commands for problem in check_command(command, verbs)]
    assert not problems, "\n".join(problems)


def test_cli_md_names_every_verb_and_option(verbs: dict[tuple[str, ...], Verb]) -> None:
    named: dict[tuple[str, ...], set[str]] = {}
    for command in commands_in(CLI_DOC.read_text(), "docs/cli.md"):
        if command.program == "robo-pipe" and not check_command(command, verbs):
            verb = verb_of(command, verbs)
            named.setdefault(verb.path, set()).update(
                clean(w).partition("=")[0] for w in command.words
            )
    missing = []
    for path, verb in verbs.items():
        shown = " ".join(("robo-pipe", *path))
        if verb.subverbs and path:
            continue  # a group is named through its verbs
        if path not in named:
            missing.append(f"{shown}: not in docs/cli.md")
            continue
        wanted = [*verb.option_groups, *((n,) for n in verb.help_names if not path)]
        missing += [
            f"{shown}: option {'/'.join(names)} not in docs/cli.md"
            for names in wanted
            if not set(names) & named[path]
        ]
    assert not missing, "\n".join(missing)


def test_make_targets_exist() -> None:
    targets = make_targets()
    assert {"demo", "test", "setup"} <= targets
    commands = [c for c in all_commands() if c.program == "make"]
    assert any(c.words == ["demo"] for c in commands), "README names no `make demo`"
    problems = [problem for command in commands for problem in check_make(command, targets)]
    assert not problems, "\n".join(problems)


def test_relative_links_resolve() -> None:
    problems = [problem for doc in doc_files() for problem in check_links(doc, doc.read_text())]
    assert not problems, "\n".join(problems)


def test_readme_fits_in_200_lines() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


def test_the_entry_point_help_lists_the_trees_options(verbs: dict[tuple[str, ...], Verb]) -> None:
    """The installed ``robo-pipe`` is the app the tree comes from: ``run --help`` and ``models
    show --help`` list every option the tree gives those verbs."""
    program = Path(sys.executable).with_name("robo-pipe")
    entry_point = str(program) if program.exists() else shutil.which("robo-pipe")
    assert entry_point, "no robo-pipe entry point installed beside this Python"
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    for path in (("run",), ("models", "show")):
        shown = subprocess.run(
            [entry_point, *path, "--help"], capture_output=True, text=True, env=env, timeout=60
        )
        assert shown.returncode == 0, shown.stderr
        listed = set(re.findall(r"(?<![\w-])--?[a-z][\w-]*", shown.stdout))
        assert set(verbs[path].options) <= listed, (path, shown.stdout)


# --- the checks themselves catch what they are for ----------------------------------------

BROKEN = """\
Run `robo-pipe frobnicate --fast` or `robo-pipe info --no-such-option`.

```bash
ROBO_PIPE_HOME=/tmp/h robo-pipe info extra-argument && make no-such-target
prefect work-pool create robo-pipe --type process   # not a robo-pipe command
robo-pipe models bogus
```

See [nowhere](no-such-page.md), [no heading](#no-such-heading) and [fine](#broken).

# Broken
"""


def test_the_checks_catch_broken_docs(verbs: dict[tuple[str, ...], Verb], tmp_path: Path) -> None:
    """A verb, an option, an argument, a make target and links that do not exist are reported
    (and a command that only names robo-pipe as an argument is not one)."""
    commands = commands_in(BROKEN, "broken.md")
    assert [c.program for c in commands] == ["robo-pipe"] * 2 + ["robo-pipe", "make", "robo-pipe"]
    problems = [p for c in commands if c.program == "robo-pipe" for p in check_command(c, verbs)]
    assert len(problems) == 4, problems
    assert "'frobnicate' is not a verb of 'robo-pipe'" in problems[0]
    assert "'robo-pipe info' has no option --no-such-option" in problems[1]
    assert "1 arguments, 'robo-pipe info' takes 0" in problems[2]
    assert "'bogus' is not a verb of 'robo-pipe models'" in problems[3]
    assert check_make(commands[3], make_targets()) == [
        "broken.md:4: make no-such-target: no such target"
    ]
    page = tmp_path / "broken.md"
    page.write_text(BROKEN)
    links = check_links(page, BROKEN)
    assert len(links) == 2, links
    assert "no-such-page.md" in links[0] and "no heading #no-such-heading" in links[1]


def test_hidden_spellings_are_not_for_the_docs() -> None:
    """An old spelling the CLI keeps only to say what a thing is called now (a hidden verb or
    option) counts as absent: the docs may not name it, and cli.md need not."""
    cli = typer.Typer()

    @cli.command()
    def new_verb(
        new: bool = typer.Option(False, "--new"),
        old: bool = typer.Option(False, "--old", hidden=True),
    ) -> None:
        """A verb."""

    @cli.command(hidden=True)
    def old_verb() -> None:
        """What new-verb was called."""

    verbs = cli_verbs(cli)
    assert set(verbs) == {(), ("new-verb",)}
    assert verbs[("new-verb",)].option_groups == [("--new",)]
    old = Command("x.md:1", "robo-pipe", ["new-verb", "--old"])
    assert check_command(old, verbs) == [
        "x.md:1: 'robo-pipe new-verb --old': 'robo-pipe new-verb' has no option --old"
    ]
