"""``omniqueue --help``: every command has a description, every option its default;
docs/cli.md documents every command and option; the command lines of the README and
docs/cli.md parse; the default data directory is absolute and per user."""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.help import HelpFormatter
from cli.main import build_parser
from cli.paths import default_data_dir, default_database_url, use_default_database

REPO = Path(__file__).resolve().parents[2]
CLI_MD = REPO / "docs" / "cli.md"


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, str | None]]:
    """(command path, its parser, its one-line help) of every command and subcommand."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias (generate → video)
                    continue
                seen.add(id(sub))
                yield (*path, name), sub, helps.get(name)
                yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(build_parser()))


def test_every_command_is_covered() -> None:
    names = {" ".join(path) for path, _, _ in COMMANDS}
    assert {
        "up",
        "api",
        "worker",
        "migrate",
        "loras",
        "keys",
        "keys create",
        "webhooks add",
    } <= names
    client = ("video", "audio", "speech", "status", "list", "cancel", "download", "models")
    assert set(client) <= names


@pytest.mark.parametrize(
    ("path", "parser", "help"), COMMANDS, ids=[" ".join(c[0]) for c in COMMANDS]
)
def test_every_command_and_option_is_described_with_its_default(
    path: tuple[str, ...], parser: argparse.ArgumentParser, help: str | None
) -> None:
    assert help, f"{path}: no one-line help in its parent's list"
    assert parser.description and len(parser.description) > 20, path
    assert parser.formatter_class is HelpFormatter, path
    formatter = HelpFormatter(parser.prog)
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        text = formatter._expand_help(action) if action.help else ""
        name = "/".join(action.option_strings) or action.dest
        assert len(text) > 5, f"{path} {name}: no help"
        if action.option_strings:
            says = "(default: " in text or (action.required and "(required)" in text)
            assert says, f"{path} {name}: the help does not say its default: {text!r}"
            assert text.count("default:") == (0 if action.required else 1), (path, name, text)


def test_a_flag_shows_off_and_a_value_its_default() -> None:
    listing = {path: parser for path, parser, _ in COMMANDS}[("list",)]
    text = " ".join(listing.format_help().split())
    assert "--json one JSON object per line (default: off)" in text
    assert "--limit LIMIT how many, 1 to 100 (default: 20)" in text
    assert "--kind {all,video,audio} which jobs (default: all)" in text


def test_the_data_directory_is_absolute_per_user_and_stated(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("OMNIQ_DATA_DIR", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert default_data_dir() == tmp_path / ".local" / "share" / "omniqueue"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")
    assert default_data_dir() == tmp_path / ".local" / "share" / "omniqueue"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_data_dir() == tmp_path / "xdg" / "omniqueue"
    monkeypatch.setenv("OMNIQ_DATA_DIR", "data")
    assert default_data_dir() == tmp_path / "data"  # made absolute
    assert default_database_url() == f"sqlite:///{tmp_path / 'data' / 'omniqueue.db'}"
    assert not (tmp_path / "data").exists() and not (tmp_path / "xdg").exists()

    up = {path: parser for path, parser, _ in _commands(build_parser())}[("up",)]
    text = "".join(up.format_help().split())  # wrapped lines may break the path
    assert f"(default:{tmp_path / 'data'})" in text
    assert "$XDG_DATA_HOME/omniqueue,else~/.local/share/omniqueue" in text


def test_the_default_database_is_set_only_where_none_is_configured(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    use_default_database(env)
    expected = f"sqlite:///{tmp_path / '.local' / 'share' / 'omniqueue' / 'omniqueue.db'}"
    assert env["OMNIQ_DATABASE__URL"] == expected
    for configured in (
        {"OMNIQ_DATABASE__URL": "postgresql+psycopg://db/x"},
        {"omniq_database__url": "sqlite:///x.db"},
        {"OMNIQ_DATABASE": '{"url": "sqlite:///x.db"}'},
    ):
        env = dict(configured)
        use_default_database(env)
        assert env == configured


def _command_lines(text: str) -> Iterator[str]:
    """The ``omniqueue …`` commands of the markdown's ``bash`` blocks, one per ``&&`` or
    ``|`` part (a leading ``VAR=x`` or ``.venv/bin/`` dropped, a ``# comment`` cut)."""
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line.strip())
            for part in re.split(r"\s*(?:&&|\|)\s*", line):
                part = re.sub(r"^([A-Z_]+=\S*\s+)+", "", part)
                if re.match(r"(\.venv/bin/)?omniqueue\s", part):
                    yield shlex.join(shlex.split(part)[1:])


@pytest.mark.parametrize("doc", ["README.md", "docs/cli.md"])
def test_the_documented_command_lines_parse(doc: str) -> None:
    lines = list(_command_lines((REPO / doc).read_text()))
    assert len(lines) >= 5, lines
    for line in lines:
        try:
            build_parser().parse_args(shlex.split(line))
        except SystemExit:
            pytest.fail(f"{doc}: omniqueue {line}")


def test_docs_cli_md_documents_every_command_and_option() -> None:
    """A section headed `omniqueue NAME` per command naming each of its options (the
    client verbs' --url and --api-key once, in their own section)."""
    text = CLI_MD.read_text()
    parts = re.split(r"^#+ `omniqueue ([a-z]+(?: [a-z]+)*)`.*$", text, flags=re.M)
    sections = dict(zip(parts[1::2], parts[2::2], strict=True))
    shared = ("--url", "--api-key")
    for option in shared:
        assert f"`{option}" in text, option
    for path, parser, _ in COMMANDS:
        name = " ".join(path)
        assert name in sections, f"docs/cli.md has no section `omniqueue {name}`"
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help", *shared):
                    assert f"`{option}" in sections[name], f"docs/cli.md, {name}: {option}"
