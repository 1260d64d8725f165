"""DSN handling: accepted forms, precedence, and redaction (a password is never shown)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from pgjobs import ConfigurationError, DatabaseUnavailable, db
from pgjobs.db.dsn import Dsn, normalize_dsn, redact, resolve_dsn, scrub


@pytest.mark.parametrize(
    "raw",
    [
        "postgresql://u:pw@h:5432/app",
        "postgres://u:pw@h:5432/app",
        "postgresql+psycopg://u:pw@h:5432/app",
        "postgresql+psycopg2://u:pw@h:5432/app",
        "  POSTGRESQL://u:pw@h:5432/app\n",
    ],
)
def test_accepted_forms_normalise_to_libpq_urls(raw):
    dsn = normalize_dsn(raw, "--dsn")
    assert dsn.url == "postgresql://u:pw@h:5432/app"
    assert dsn.sqlalchemy_url == "postgresql+psycopg://u:pw@h:5432/app"
    assert dsn.source == "--dsn"


@pytest.mark.parametrize(
    "raw", ["mysql://root@h/db", "mysql://root:secret@h/db", "", "h:5432/app", "secret"]
)
def test_other_forms_are_refused_without_echoing_them(raw):
    with pytest.raises(ConfigurationError, match=r"\$PGJOBS_DATABASE_URL.*postgresql://") as e:
        normalize_dsn(raw, "$PGJOBS_DATABASE_URL")
    assert "secret" not in str(e.value)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:secret@h:5432/app", "postgresql://u:***@h:5432/app"),
        ("postgresql://u:se%40cret@h/app", "postgresql://u:***@h/app"),
        ("postgresql://u:p@ss:word@h/app", "postgresql://u:***@h/app"),
        ("postgresql://:secret@h/app", "postgresql://:***@h/app"),
        ("postgresql://u@h/app", "postgresql://u@h/app"),
        ("postgresql://h/app?sslmode=require", "postgresql://h/app?sslmode=require"),
    ],
)
def test_redact_hides_the_password(url, expected):
    assert redact(url) == expected
    assert Dsn(url, "test").redacted == expected


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@h/app?password=secret",
        "postgresql://u@h/app?sslmode=require&password=secret",
        "postgresql://u:secret@h/app?password=secret",
    ],
)
def test_redact_hides_a_password_given_as_a_parameter(url):
    redacted = redact(url)
    assert "secret" not in redacted
    assert redacted.startswith("postgresql://u")
    assert "h/app" in redacted


def test_redact_survives_garbage():
    assert "secret" not in redact("postgresql://u:secret@[::1/app")


def test_resolve_precedence(monkeypatch):
    monkeypatch.setenv("PGJOBS_DATABASE_URL", "postgresql://from-pgjobs-env/app")
    monkeypatch.setenv("DATABASE_URL", "postgres://from-database-url/app")
    assert resolve_dsn("postgresql+psycopg://explicit/app").url == "postgresql://explicit/app"
    assert resolve_dsn(None).url == "postgresql://from-pgjobs-env/app"
    assert resolve_dsn(None).source == "$PGJOBS_DATABASE_URL"
    monkeypatch.delenv("PGJOBS_DATABASE_URL")
    assert resolve_dsn(None).url == "postgresql://from-database-url/app"
    assert resolve_dsn(None).source == "$DATABASE_URL"


def test_unreachable_error_shows_the_redacted_dsn_only():
    dsn = normalize_dsn("postgresql://u:hunter2@127.0.0.1:1/x?connect_timeout=2", "--dsn")
    with pytest.raises(DatabaseUnavailable) as raised:
        db.connect(dsn)
    message = str(raised.value)
    assert "hunter2" not in message
    assert "u:***@127.0.0.1:1" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:p#?/@%:x@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u:p%23%3F%2F%40%25%3Ax@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:sec%ret@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:a#b@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:a?b@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:a/b@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u@h/db?password=p#?/@%:x", "postgresql://u@h/db?password=***"),
        ("postgresql://u@h/db?pass%77ord=s&a=b", "postgresql://u@h/db?pass%77ord=***&a=b"),
        ("postgresql://u@h/db?sslpassword=s", "postgresql://u@h/db?sslpassword=***"),
        ("host=h password=secret port=5", "host=h password=*** port=5"),
        ("host=h password = 'se cr\\'et' dbname=x", "host=h password = *** dbname=x"),
        ("host=h password=se cret dbname=x", "host=h password=*** dbname=x"),
        ("password=secret", "password=***"),
    ],
)
def test_redact_hides_the_password_of_every_dsn_shape(url, expected):
    assert redact(url) == expected


@pytest.mark.parametrize(
    ("url", "echoed"),
    [
        ("postgresql://u:p#?/@%:x@127.0.0.1:5432/db", "%:x"),  # a piece of the password
        ("postgresql://u:sec%ret@127.0.0.1/db", "sec%ret"),  # the token
        ("postgresql://u:p%23%3F%2F%40%25%3Ax@[::1/db", "p%23%3F%2F%40%25%3Ax"),  # the whole URL
        ("postgresql://u@h/db?password=sec%ret", "sec%ret"),
        ("postgresql://u:zq x7w@h/db", "zq x7w"),
        ("host=h password=zq x7wk", "x7wk"),  # the password's second word, as a key
    ],
)
def test_scrub_removes_what_libpq_echoes_of_the_password(url, echoed):
    """libpq's own parse errors quote the URL, a token or a piece of the password."""
    with pytest.raises(psycopg.ProgrammingError) as refused:
        conninfo_to_dict(url)
    message = str(refused.value)
    assert echoed in message  # what is to be scrubbed is there
    scrubbed = scrub(message, url)
    assert echoed not in scrubbed
    assert "***" in scrubbed


def test_scrub_redacts_urls_and_passwords_without_the_dsn():
    assert scrub("at postgresql://u:secret@h/db: refused") == "at postgresql://u:***@h/db: refused"
    assert "secret" not in scrub("bad option password=secret")
    assert scrub('relation "x" does not exist') == 'relation "x" does not exist'


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:p#?/@%:x@h:5432/db",
        "postgresql://u:sec%ret@h/db",
        "postgresql://u:p@ss:word@h/db",
        "postgresql://u:pw@h:99999/db",
        "postgresql://u:pw@[::1/db",
    ],
)
def test_a_dsn_libpq_cannot_read_is_refused_as_configuration(url):
    with pytest.raises(ConfigurationError, match=r"^--dsn (is not a valid|has port)") as refused:
        normalize_dsn(url, "--dsn")
    for piece in ("%:x", "sec%", "@ss:", "ss:w"):
        assert piece not in str(refused.value)


def test_scrub_keeps_a_message_readable_when_the_password_is_one_letter():
    url = "postgresql://u:e@h:1/db"
    message = 'connection to server at "h", port 1 failed: the server expected e to be there'
    assert scrub(message, url) == message
    assert scrub(f"bad {url} here", url) == "bad postgresql://u:***@h:1/db here"


@pytest.mark.parametrize(
    ("conninfo", "url"),
    [
        ("host=127.0.0.1 dbname=app user=postgres", "postgresql://postgres@127.0.0.1/app"),
        ("host=h port=5433 dbname=app", "postgresql://h:5433/app"),
        ("  dbname=app  ", "postgresql:///app"),
        ("host=::1 port=5432 dbname=app", "postgresql://[::1]:5432/app"),
        ("host=h user=u password='p w@#' dbname=app", "postgresql://u:p%20w%40%23@h/app"),
        ("host=/var/run/postgresql dbname=app", "postgresql:///app?host=%2Fvar%2Frun%2Fpostgresql"),
        ("host=h1,h2 port=5432,5433 dbname=app", "postgresql:///app?host=h1%2Ch2&port=5432%2C5433"),
        ("host=h dbname='my db' sslmode=require", "postgresql://h/my%20db?sslmode=require"),
    ],
)
def test_libpq_key_value_strings_become_the_url_that_means_the_same(conninfo, url):
    dsn = normalize_dsn(conninfo, "App(dsn=...)")
    assert dsn.url == url
    assert dsn.source == "App(dsn=...)"
    assert conninfo_to_dict(dsn.url) == conninfo_to_dict(conninfo), "libpq reads both alike"


@pytest.mark.parametrize(
    "conninfo", ["host=h password='unterminated", "host=h bogus_option=1 password=secret"]
)
def test_a_key_value_string_libpq_cannot_read_is_refused_naming_its_source(conninfo):
    with pytest.raises(ConfigurationError, match=r"^App\(dsn=\.\.\.\) is not a valid") as e:
        normalize_dsn(conninfo, "App(dsn=...)")
    assert "--dsn" not in str(e.value)
    assert "secret" not in str(e.value) and "unterminated" not in str(e.value)


def test_a_key_value_port_that_is_not_a_number_is_refused():
    with pytest.raises(ConfigurationError, match=r"^App\(dsn=\.\.\.\) has port"):
        normalize_dsn("host=h port=abc dbname=app", "App(dsn=...)")


def test_key_value_passwords_are_redacted_once_normalised():
    dsn = normalize_dsn("host=h user=u password=hunter22 dbname=app", "App(dsn=...)")
    assert dsn.redacted == "postgresql://u:***@h/app"
    assert "hunter22" not in dsn.redacted


def test_resolve_dsn_names_the_source_it_is_given(monkeypatch):
    monkeypatch.setenv("PGJOBS_DATABASE_URL", "postgresql://from-env/app")
    dsn = resolve_dsn("host=h dbname=app", source="App(dsn=...)")
    assert (dsn.url, dsn.source) == ("postgresql://h/app", "App(dsn=...)")
    with pytest.raises(ConfigurationError, match=r"^App\(dsn=\.\.\.\) has scheme"):
        resolve_dsn("mysql://h/app", source="App(dsn=...)")


@pytest.mark.parametrize(
    "raw",
    [
        "postgresql://u:p%23w@h1:5432,h2:5433/app?target_session_attrs=read-write",
        "postgres://u@h1,h2/app?target_session_attrs=primary&connect_timeout=3",
        "postgresql+psycopg://u@[::1]:5432,h2:5433/app",
        "postgresql://u@/app?host=/var/run/postgresql,/tmp&port=5432,5433",
        "postgresql:///app?host=h1,h2&port=5432,5433&target_session_attrs=read-write",
    ],
)
def test_multi_host_urls_keep_every_host_as_libpq_reads_them(raw):
    dsn = normalize_dsn(raw, "--dsn")
    assert dsn.url.startswith("postgresql://")
    assert conninfo_to_dict(dsn.url) == conninfo_to_dict(raw.replace("+psycopg", ""))


def test_a_multi_host_url_with_a_port_that_is_not_a_number_is_refused():
    with pytest.raises(ConfigurationError, match=r'^--dsn has port "x"'):
        normalize_dsn("postgresql://u:pw@h1:5432,h2:x/app", "--dsn")


@pytest.mark.parametrize(
    "raw",
    [
        "postgresql://u:p%23w@h1:5432,h2:5433/app?target_session_attrs=read-write",
        "host=h1,h2 port=5432,5433 user=u password='p w' dbname=app target_session_attrs=any",
        "postgresql://u@/app?host=/var/run/postgresql",
    ],
)
def test_the_migrations_engine_takes_every_dsn_form_libpq_reads(raw):
    # SQLAlchemy's URL parser reads one host and a numeric port; the engine never parses the
    # DSN itself, psycopg opens its connections (nothing connects here).
    engine = db.sqlalchemy_engine(normalize_dsn(raw, "--dsn"))
    assert engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg"
    engine.dispose()


def test_a_read_dsn_is_checked_like_the_dsn():
    from pgjobs import App

    app = App("postgresql://h/app", read_dsn="host=h2,h1 dbname=app target_session_attrs=any")
    assert app.read_dsn is not None and app.read_dsn.source == "App(read_dsn=...)"
    assert App("postgresql://h/app").read_dsn is None
    with pytest.raises(ConfigurationError, match=r'^App\(read_dsn=\.\.\.\) has port "x"'):
        App("postgresql://h/app", read_dsn="host=h port=x")
