"""Shell completion (typer's): `pgjobs --show-completion` prints the script a shell sources, and
the script's callback completes commands and options."""

from __future__ import annotations

import os
import subprocess

import pytest

from pgjobs import cli
from tests.support.helpers import REPO, pgjobs_command


def completion_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("_PGJOBS_COMPLETE")}
    env.update(extra)
    return env


def test_show_completion_bash_prints_a_completion_script():
    # The shell is named on the command line (detection off), and SHELL agrees with it.
    env = completion_env(SHELL="/bin/bash", _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1")
    done = subprocess.run(
        pgjobs_command("--show-completion", "bash"),
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "_PGJOBS_COMPLETE=complete_bash" in done.stdout
    assert "complete -o default -F _pgjobs_completion pgjobs" in done.stdout


@pytest.mark.parametrize(("shell", "marker"), [("zsh", "#compdef pgjobs"), ("fish", "complete ")])
def test_other_shells_get_their_own_script(shell, marker):
    env = completion_env(SHELL=f"/bin/{shell}", _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1")
    done = subprocess.run(
        pgjobs_command("--show-completion", shell),
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert marker in done.stdout


@pytest.mark.parametrize(
    ("words", "cword", "expected"),
    [("pgjobs doc", "1", "doctor"), ("pgjobs stats --j", "2", "--json")],
)
def test_the_script_completes_commands_and_options(words, cword, expected):
    # What the bash script runs on Tab: pgjobs itself, told what was typed.
    env = completion_env(_PGJOBS_COMPLETE="complete_bash", COMP_WORDS=words, COMP_CWORD=cword)
    done = subprocess.run(
        pgjobs_command(), env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [expected]


def test_show_completion_in_process_returns_0(capsys, monkeypatch):
    monkeypatch.setenv("SHELL", "/bin/bash")
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    assert cli.main(["--show-completion", "bash"]) == 0
    assert "_pgjobs_completion" in capsys.readouterr().out


def test_help_lists_the_completion_options(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--install-completion" in out
    assert "--show-completion" in out
    assert "doctor" in out


@pytest.mark.parametrize(
    ("argv", "written", "absent"),
    [
        (["--install-completion", "zsh"], ".zfunc/_pgjobs", ".bash_completions"),
        (["--install-completion=fish"], ".config/fish/completions/pgjobs.fish", ".zfunc"),
        (["--debug", "--install-completion", "bash"], ".bash_completions/pgjobs.sh", ".zfunc"),
    ],
)
def test_install_completion_installs_for_the_shell_named(tmp_path, argv, written, absent):
    # The shell detected (bash here) must not win over the one the user named.
    env = completion_env(HOME=str(tmp_path), SHELL="/bin/bash")
    done = subprocess.run(
        pgjobs_command(*argv), env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    script = (tmp_path / written).read_text()
    assert "pgjobs" in script
    assert not (tmp_path / absent).exists()


def test_show_completion_prints_the_script_of_the_shell_named(capsys, monkeypatch):
    monkeypatch.setenv("SHELL", "/bin/bash")
    assert cli.main(["--show-completion", "zsh"]) == 0
    assert "#compdef pgjobs" in capsys.readouterr().out


@pytest.mark.parametrize("option", ["--install-completion", "--show-completion"])
def test_an_unknown_shell_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, option):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cli.main([option, "tcsh"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "expected one of bash, zsh" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv", [["--help"], ["stats", "--help"], ["dead", "list", "--help"], ["work", "--help"]]
)
def test_help_shows_no_type_beside_a_flag(capsys, monkeypatch, argv):
    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "<bool>" not in out
    assert "--help" in out


def test_help_still_shows_the_type_of_an_option_that_takes_a_value(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(["dead", "list", "--help"]) == 0
    assert "<int range>" in capsys.readouterr().out
