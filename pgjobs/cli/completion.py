"""Shell completion and the help's look: the command as ``main`` runs it.

typer's ``--install-completion`` and ``--show-completion`` are flags that detect the shell, so a
shell named after them (``--install-completion zsh``) was ignored and the detected one used;
``named_shell`` reads that form first. typer's rich help also prints a type (``<bool>``) beside
flags, which take no value: ``command`` clears it, and gives each option its lean conversion
(``coercion``).
"""

from __future__ import annotations

from collections.abc import Sequence

import typer
import typer.main
from typer._completion_shared import get_completion_script, install  # what typer's options call
from typer.core import TyperCommand, TyperGroup, TyperOption

from pgjobs.cli.coercion import lean
from pgjobs.cli.commands import LazyGroup
from pgjobs.errors import ConfigurationError

SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")
INSTALL = "--install-completion"
SHOW = "--show-completion"
PROG = "pgjobs"
COMPLETE_VAR = "_PGJOBS_COMPLETE"
_HELP = {
    INSTALL: "Install tab completion for the current shell, or for the one named after it "
    f"({', '.join(SHELLS)}): --install-completion zsh.",
    SHOW: "Print the completion script for the current shell, or for the one named after it "
    "(--show-completion zsh), to copy it or customize the installation.",
}


def command(app: typer.Typer) -> TyperGroup | TyperCommand:
    """The click command of ``app`` with no type shown beside a flag and the completion options'
    help saying a shell may be named."""
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup | TyperCommand)
    if isinstance(root, LazyGroup):
        root.adjust = _adjust  # the commands load when they run
    _adjust(root)
    return root


def _adjust(cmd: TyperGroup | TyperCommand) -> None:
    for param in [*cmd.params, cmd.get_help_option(typer.Context(cmd))]:
        lean(param)
        if isinstance(param, TyperOption) and param.is_flag:
            param.metavar = ""  # typer's rich help prints the metavar in place of "<bool>"
            if param.opts and param.opts[0] in _HELP:
                param.help = _HELP[param.opts[0]]
    for sub in cmd.commands.values() if isinstance(cmd, TyperGroup) else ():
        if isinstance(sub, TyperGroup | TyperCommand):
            _adjust(sub)


def named_shell(argv: Sequence[str]) -> tuple[str, str] | None:
    """``(option, shell)`` when ``argv`` is ``--install-completion SHELL`` or
    ``--show-completion=SHELL`` (after ``--debug``), else None; an unknown shell is refused.

    Example: ``named_shell(["--install-completion", "zsh"]) == ("--install-completion", "zsh")``.
    """
    args = [a for a in argv if a != "--debug"]
    if not args:
        return None
    option, equals, value = args[0].partition("=")
    if option not in (INSTALL, SHOW):
        return None
    if not equals:
        if len(args) < 2 or args[1].startswith("-"):
            return None  # no shell named: typer detects it
        value = args[1]
    if value not in SHELLS:
        raise ConfigurationError(f"{option} {value!r}: expected one of {', '.join(SHELLS)}")
    return option, value


def complete_for(option: str, shell: str) -> None:
    """Install (``--install-completion``) or print the completion script of ``shell``."""
    if option == SHOW:
        typer.echo(get_completion_script(prog_name=PROG, complete_var=COMPLETE_VAR, shell=shell))
        return
    installed, path = install(shell=shell, prog_name=PROG, complete_var=COMPLETE_VAR)
    typer.echo(f"{installed} completion installed in {path}")
    typer.echo("Completion will take effect once you restart the terminal")
