"""A process imports what it uses: `pgjobs --help` no driver and no command module, a worker
neither rich nor the web, tracing or templating libraries, `import pgjobs` nothing until a name
is used. Each check runs in a fresh interpreter, so an eager import added anywhere fails it."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import typer
from typer._coercion import build_runtime_param, resolve_type_descriptor

import pgjobs
from pgjobs.cli import cli
from pgjobs.cli.coercion import LeanParam
from pgjobs.cli.commands import COMMANDS, load
from pgjobs.cli.completion import command

#: Libraries only some commands need (the web extra, OpenTelemetry, templates, rich's rendering).
OPTIONAL = ("fastapi", "starlette", "uvicorn", "opentelemetry", "jinja2", "rich")

CHECK = """
import json, sys
{imports}
print(json.dumps(sorted(sys.modules)))
"""


def loaded(imports: str) -> set[str]:
    code = CHECK.format(imports=imports)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return set(json.loads(result.stdout))


def tops(modules: set[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


def test_the_cli_entry_imports_no_command_and_no_driver() -> None:
    modules = loaded("import pgjobs.cli")
    assert not tops(modules) & {*OPTIONAL, "psycopg", "psycopg_pool"}
    # The installed version is read only for --version (importlib.metadata brings email and
    # importlib.resources: about 20 ms of `pgjobs --help`).
    assert "importlib.metadata" not in modules
    commands = {m for m in modules if m.startswith("pgjobs.cli.")}
    light = {"commands", "completion", "messages", "coercion"}
    assert commands <= {f"pgjobs.cli.{name}" for name in light}


@pytest.mark.parametrize(
    "imports",
    [
        # what `pgjobs work --app benchmarks.tasks:app` imports before it runs the worker
        "from pgjobs.cli.commands import load; load('work'); import benchmarks.tasks",
        "from pgjobs.cli.commands import load; load('enqueue')",
        "from pgjobs import App, Worker, WorkerConfig",
    ],
)
def test_worker_and_enqueue_import_no_optional_library(imports: str) -> None:
    assert not tops(loaded(imports)) & set(OPTIONAL)


#: What neither `pgjobs enqueue` nor a worker uses: psycopg_pool (both use plain connections),
#: the admin operations (which bring the completer's reports), batches and schedules, hashlib
#: (~0.7 MiB resident; the embedded server's socket folder only), cronsim (cron schedules) and
#: tomllib (read only when a command looks in pyproject.toml).
UNUSED_BY_ENQUEUE_AND_WORKER = {
    "psycopg_pool",
    "pgjobs.admin",
    "pgjobs.batches",
    "pgjobs.schedules",
    "hashlib",
    "cronsim",
    "tomllib",
}


@pytest.mark.parametrize(
    "imports",
    [
        "from pgjobs.cli.commands import load; load('work'); import benchmarks.tasks",
        "from pgjobs.cli.commands import load; load('enqueue')",
        "import pgjobs.app",
    ],
)
def test_enqueue_and_the_worker_load_no_pool_and_no_admin(imports: str) -> None:
    assert not loaded(imports) & UNUSED_BY_ENQUEUE_AND_WORKER


def test_the_pool_and_admin_load_on_use() -> None:
    modules = loaded(
        "import pgjobs\n"
        "app = pgjobs.App('postgresql://u@127.0.0.1:1/db')\n"
        "try:\n"
        "    app.open()\n"
        "except pgjobs.DatabaseUnavailable:\n"
        "    pass\n"
        "try:\n"
        "    app.job(1)\n"
        "except pgjobs.DatabaseUnavailable:\n"
        "    pass\n"
    )
    assert "pgjobs.admin" in modules


def test_import_pgjobs_loads_names_on_use() -> None:
    modules = loaded("import pgjobs")
    assert {m for m in modules if m.startswith("pgjobs")} == {"pgjobs"}
    assert "psycopg" not in modules
    modules = loaded("from pgjobs import Job, JobStatus")
    assert "pgjobs.models" in modules and "pgjobs.app" not in modules


def test_every_public_name_resolves() -> None:
    for name in pgjobs.__all__:
        assert getattr(pgjobs, name) is not None, name
    assert set(pgjobs.__all__) <= set(dir(pgjobs))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        pgjobs.Nope  # noqa: B018


def test_the_help_table_matches_each_command() -> None:
    """``pgjobs --help`` lists the commands from ``COMMANDS``: each line is the first paragraph
    of the command's own help, and every command of the table loads."""
    for name, entry in COMMANDS.items():
        real = load(name)
        first = (real.help or "").strip().split("\n\n")[0]
        assert " ".join(first.split()) == " ".join(entry.help.split()), name


def test_the_root_lists_every_command() -> None:
    root = command(cli)
    assert isinstance(root, typer.core.TyperGroup)
    ctx = typer.Context(root)
    assert root.list_commands(ctx) == list(COMMANDS)
    work = root.get_command(ctx, "work")
    assert work is not None and any(p.name == "concurrency" for p in work.params)
    assert root.get_command(ctx, "nope") is None


def test_a_command_runs_without_pydantic() -> None:
    """typer converts option values through Pydantic; pgjobs' lean conversion spares a command
    (and a worker's whole life) that import."""
    modules = loaded(
        "from pgjobs.cli import main\n"
        "main(['enqueue', 't', '--priority', '3', '--delay', '0.5', '--tag', 'a',"
        " '--dsn', 'postgresql://u@127.0.0.1:1/db'])"
    )
    assert "pgjobs.cli.enqueue" in modules
    assert not tops(modules) & {"pydantic", "pydantic_core", "rich"}


def _params() -> list[tuple[str, Any]]:
    found = []

    def walk(path: str, cmd: Any) -> None:
        for param in cmd.params:
            if isinstance(param._runtime_param, LeanParam):
                found.append((f"{path} {param.name}", (cmd, param)))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(f"{path} {name}", sub)

    root = command(cli)
    assert isinstance(root, typer.core.TyperGroup)
    walk("pgjobs", root)
    for name in COMMANDS:
        walk(f"pgjobs {name}", root.get_command(typer.Context(root), name))
    return found


VALUES = {
    int: [
        "8",
        "-3",
        "+5",
        "007",
        "0",
        "32767",
        "32768",
        "-32769",
        "abc",
        "1.5",
        "",
        " 4",
        "1_000",
        "9" * 30,
        5,
        True,
    ],
    float: ["0.5", "0", "-1", "3", "1e3", "inf", "nan", "abc", "", "0.000001", 2, 2.5, False],
    str: ["x", "", " spaced ", "ünï", 5],
    bool: [True, False, "yes", "0"],
}


def _outcome(runtime: Any, value: Any, param: Any, ctx: Any) -> tuple[str, Any]:
    try:
        result = runtime._coerce_value(value, param=param, ctx=ctx)
    except Exception as exc:  # the error a user would see
        return "error", (type(exc).__name__, str(exc))
    return "value", (type(result).__name__, result)


@pytest.mark.parametrize("where, found", _params(), ids=lambda v: v if isinstance(v, str) else "")
def test_lean_conversion_equals_typers(where: str, found: tuple[Any, Any]) -> None:
    """Every value converts, or is refused with the same message, as typer's own conversion
    does it; the lean path only spares the import."""
    cmd, param = found
    lean_param: LeanParam = param._runtime_param
    descriptor = resolve_type_descriptor(lean_param.annotation, lean_param.parameter_info)
    typers = build_runtime_param(descriptor)
    ctx = typer.Context(cmd)
    values = VALUES[lean_param.kind]
    cases = [[v, v] for v in values] if lean_param.many else values
    for value in cases:
        lean_says, typer_says = (
            _outcome(lean_param, value, param, ctx),
            _outcome(typers, value, param, ctx),
        )
        assert repr(lean_says) == repr(typer_says), (
            where,
            value,
        )


def test_a_command_collects_again_once_its_module_has_loaded() -> None:
    """``pgjobs.cli.run`` keeps the cyclic collector off while the command's modules import,
    then freezes what they made and turns it back on: a long command (a worker, the server)
    collects its own garbage as any process does."""
    code = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print(gc.isenabled(), gc.get_freeze_count() > 0))\n"
        "sys.argv = ['pgjobs', 'enqueue', '--help']\n"
        "from pgjobs.cli import run\n"
        "run()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "True True"
