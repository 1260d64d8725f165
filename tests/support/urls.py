"""URLs the tests derive from the test server's: the same database through another address (a
PgBouncer, a relay), as another role, or another database on the same server. Each is rebuilt
from the parameters libpq reads in the URL, whatever form it takes (``user@127.0.0.1:5432/db``,
the embedded server's ``user:@127.0.0.1:5432/db?host=/socket/folder``, a ``key=value``
string), so that no parameter of the old address (a ``host=`` socket folder, a ``hostaddr=``)
rides along to the new one, and none is lost on the way to the same one.

Example::

    url_with(dsn.url, host="127.0.0.1", port=bouncer.port)  # the same database, elsewhere
    url_with(dsn.url, user="reader")  # as another role (without the first one's password)
    url_with(dsn.url, dbname="postgres")  # another database on the same server
"""

from __future__ import annotations

from urllib.parse import quote, urlencode, urlunsplit

from psycopg.conninfo import conninfo_to_dict

#: The parameters that say where the server is: a new host replaces all of them.
ADDRESS = ("host", "hostaddr", "port")


def url_with(
    url: str,
    *,
    host: str | None = None,
    port: int | str | None = None,
    user: str | None = None,
    password: str | None = None,
    raw_password: str | None = None,
    dbname: str | None = None,
) -> str:
    """``url`` (a URL or a ``key=value`` string) with the parts given replaced, as a
    ``postgresql://`` URL. ``host``: another address (a name, an IP address or a socket folder),
    at ``port`` or the default one; ``port`` alone: another port on the same host. ``user``:
    another role, without the old role's password unless ``password`` (percent-encoded here) or
    ``raw_password`` (written as given, to make URLs libpq cannot read) is given too."""
    params = {key: str(value) for key, value in conninfo_to_dict(url).items() if value is not None}
    if host is not None:
        for key in ADDRESS:
            params.pop(key, None)
        params["host"] = host
    if port is not None:
        params["port"] = str(port)
    if user is not None:
        params["user"] = user
        params.pop("password", None)
    if password is not None:
        params["password"] = password
    if dbname is not None:
        params["dbname"] = dbname
    return _as_url(params, raw_password)


def _as_url(params: dict[str, str], raw_password: str | None) -> str:
    """The URL of libpq's parameters ``params``: the user, password, one TCP host and port and
    the database in their places; a socket folder, several hosts and every other parameter in
    the query."""
    user, password = params.pop("user", None), params.pop("password", None)
    dbname = params.pop("dbname", "")
    userinfo = quote(user, safe="") if user else ""
    if raw_password is not None:
        userinfo += f":{raw_password}"
    elif password:
        userinfo += f":{quote(password, safe='')}"
    host, port = params.get("host", ""), params.get("port", "")
    netloc = ""
    if host and not host.startswith("/") and "," not in host + port and "hostaddr" not in params:
        params.pop("host")
        netloc = f"[{host}]" if ":" in host else host
        if params.pop("port", None):
            netloc += f":{port}"
    if userinfo:
        netloc = f"{userinfo}@{netloc}"
    first = {key: params.pop(key) for key in ADDRESS if key in params}
    query = urlencode({**first, **params}, quote_via=quote)
    return urlunsplit(("postgresql", netloc, f"/{quote(dbname, safe='')}", query, ""))
