"""``--help`` for every ``omniqueue`` command: a description, and each option's default.

:class:`HelpFormatter` appends ``(default: X)`` to an option's help from its default, and
``(default: off)`` to a flag's; an option whose default is decided elsewhere (``None``:
the server's, the model's, an environment variable) states it in its own help text,
which then already contains ``(default: …)``. Descriptions are filled to the terminal's
width paragraph by paragraph; a paragraph whose lines are indented (examples) is kept as
written (its other lines indented). :func:`command` adds a subcommand with both,
:func:`command_group` one with subcommands of its own.
"""

from __future__ import annotations

import argparse
import inspect
import textwrap
from collections.abc import Callable
from typing import Any


class HelpFormatter(argparse.HelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        says = "default:" in text  # "(default: …)", or "(…; default: …)" of its own
        if not action.option_strings or says or action.default is argparse.SUPPRESS:
            return text
        if isinstance(action, argparse._StoreTrueAction):
            return f"{text} (default: off)"
        if action.default is None or action.default == []:
            return text  # the help must say it; tests/unit/test_cli_help.py checks that
        return f"{text} (default: %(default)s)"

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for paragraph in inspect.cleandoc(text).split("\n\n"):
            if any(line.startswith(" ") for line in paragraph.splitlines()):
                out.append(textwrap.indent(paragraph, indent))  # examples: as written
            else:
                flat = " ".join(paragraph.split())
                out.append(
                    textwrap.fill(flat, width, initial_indent=indent, subsequent_indent=indent)
                )
        return "\n\n".join(out)


def command(sub: Any, name: str, help: str, description: str, **kwargs: Any) -> Any:
    """A subcommand of ``sub`` (an ``add_subparsers`` action) with a one-line ``help``
    for its parent's list, a ``description`` for its own ``--help``, and the formatter."""
    return sub.add_parser(
        name, help=help, description=description, formatter_class=HelpFormatter, **kwargs
    )


def command_group(
    sub: Any,
    name: str,
    help: str,
    description: str,
    *,
    dest: str,
    func: Callable[[argparse.Namespace], int],
    uses_database: bool,
) -> Any:
    """A :func:`command` of subcommands (``omniqueue NAME COMMAND``), all run by ``func``,
    which finds the one given in ``dest``; its ``add_subparsers`` action, for
    :func:`command` to add them to."""
    group = command(sub, name, help=help, description=description)
    group.set_defaults(func=func, uses_database=uses_database)
    return group.add_subparsers(dest=dest, required=True, title="commands", metavar="COMMAND")
