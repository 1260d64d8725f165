"""Every form of DSN libpq reads works in every command: multi-host URLs and key=value strings
whose first host is a closed port (as after a failover, with ``target_session_attrs``), the
``postgres://`` and ``postgresql+psycopg://`` schemes, a Unix socket directory as ``?host=`` or
``host=``, a percent-encoded password; `pgjobs serve`'s API too, with the DSN as its read DSN."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgjobs import App
from pgjobs.web import create_app
from tests.support.helpers import homes, run
from tests.web.conftest import AUTH, TOKEN, TestClient

APP = "tests.integration.cli_app:app"
#: A password of the characters URL parsers trip on; the test server trusts local connections
#: (as the secrets tests assume), so it is read and sent but not checked.
PASSWORD = "p#?/@%:x,"
FORMS = [
    "multi-host-url",
    "multi-host-key-value",
    "postgres-scheme",
    "psycopg-scheme",
    "socket-query",
    "socket-key-value",
]

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def socket_dir(url: str, port: str) -> str:
    """The server's Unix socket directory, skipping when it has none on this machine."""
    with psycopg.connect(url) as conn:
        found = conn.execute("SHOW unix_socket_directories").fetchone()
    for folder in str(found[0] if found else "").split(","):
        if folder.strip() and Path(folder.strip(), f".s.PGSQL.{port}").exists():
            return folder.strip()
    pytest.skip("the test server has no Unix socket on this machine")


def dsn_form(form: str, url: str) -> str:
    """The test database's ``url`` written in ``form``."""
    params = {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}
    host, port = params.get("host", "127.0.0.1"), params.get("port", "5432")
    user, dbname = params.get("user", "postgres"), params["dbname"]
    password = params.get("password", PASSWORD)
    closed = closed_port()
    rest = url.split("://", 1)[1]
    if form == "multi-host-url":
        return (
            f"postgresql://{quote(user, safe='')}:{quote(password, safe='')}@127.0.0.1:{closed},"
            f"{quote(host, safe='')}:{port}/{quote(dbname, safe='')}"
            "?target_session_attrs=read-write&connect_timeout=3"
        )
    if form == "multi-host-key-value":
        return make_conninfo(
            host=f"127.0.0.1,{host}",
            port=f"{closed},{port}",
            user=user,
            password=password,
            dbname=dbname,
            target_session_attrs="read-write",
            connect_timeout="3",
        )
    if form == "postgres-scheme":
        return f"postgres://{rest}"
    if form == "psycopg-scheme":
        return f"postgresql+psycopg://{rest}"
    folder = socket_dir(url, port)
    if form == "socket-query":
        return f"postgresql://{quote(user, safe='')}@/{dbname}?host={folder}&port={port}"
    return make_conninfo(host=folder, port=port, user=user, dbname=dbname)


@pytest.mark.parametrize("form", FORMS)
def test_every_command_works_with_the_dsn_form(capsys, create_database, form):
    written = dsn_form(form, create_database().url)

    def ok(*argv: str) -> str:
        code, out, err = run(capsys, *argv, "--dsn", written)
        assert code == 0, (argv, err)
        assert PASSWORD not in out + err and quote(PASSWORD, safe="") not in out + err
        return out

    assert "created at" in ok("migrate")
    assert "nothing to do" in ok("migrate")
    ok("migrate", "--check")
    ids = [int(ok("enqueue", "cli.add", "-p", '{"a": 2, "b": 3}', "--app", APP))]
    with App(written, check_task_names=False) as app:
        ids.append(app.enqueue("cli.shout", {"text": "hi"}, queue="loud"))
    stats = {entry["queue"]: entry["ready"] for entry in json.loads(ok("stats", "--json"))}
    assert stats == {"default": 1, "loud": 1}
    ok("work", "--app", APP, "--burst", "--poll-interval", "0.05", "--no-maintenance")
    ok("job", "show", str(ids[1]))
    ok("dead", "list")
    ok("queue", "pause", "loud")
    ok("queue", "resume", "loud")
    ok("queue", "list")
    ok("schedule")
    ok("prune", "--older-than", "30d")
    web = create_app(dsn=written, read_dsn=written, tokens=[TOKEN], pool_size=1)
    with TestClient(web, headers=AUTH) as client:
        served = client.get("/api/v1/stats", params={"verbose": "true"})
        assert served.status_code == 200, served.text
        assert served.json()["replica"]["standby"] is False
        assert client.post(f"/api/v1/jobs/{ids[0]}/replay").status_code == 201
    doctor = {check["name"]: check for check in json.loads(ok("doctor", "--json"))["checks"]}
    assert doctor["pooler"]["status"] == "pass", doctor["pooler"]
    with psycopg.connect(written.replace("+psycopg", "")) as conn:
        where = homes(conn)
        assert [where[i] for i in ids] == ["archived_jobs", "archived_jobs"]
        assert len(where) == 3, "and the replayed copy"
