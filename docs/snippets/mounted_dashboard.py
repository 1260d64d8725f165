# pgjobs' dashboard and API inside your FastAPI site, under its sign-in: /jobs/ and /jobs/api/v1.
# tests/integration/docs/test_doc_snippets.py signs in as both roles and acts.
from fastapi import FastAPI
from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection, Request

import pgjobs
import pgjobs.web
from pgjobs.web import Principal, Role

app = pgjobs.App()  # your tasks' App


class SiteSignIn(AuthenticationBackend):
    """Stands for your site's own sign-in. This one believes a cookie, for the demo only."""

    async def authenticate(self, conn: HTTPConnection):
        name = conn.cookies.get("demo_user")
        if name is None:
            return None
        scopes = ["jobs:operate"] if name == "alice" else []
        return AuthCredentials(scopes), SimpleUser(name)


def who(request: Request) -> Principal | None:
    """Who pgjobs serves: your signed-in user, an operator if your site says so, else None."""
    if not request.user.is_authenticated:
        return None  # the API answers 401, the dashboard sends the browser to /login
    role = Role.OPERATE if "jobs:operate" in request.auth.scopes else Role.READ
    return Principal(request.user.display_name, role)  # the name is recorded as the actor


site = FastAPI()
site.add_middleware(AuthenticationMiddleware, backend=SiteSignIn())
site.mount("/jobs", pgjobs.web.create_app(app, auth=who, sign_in_url="/login"))
