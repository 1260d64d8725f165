"""Signing in with an API token (kept in a session cookie) and out."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from pgjobs.web.dashboard import forms
from pgjobs.web.dashboard.frame import GET, POST, BadForm, Frame, PostedForm, Route
from pgjobs.web.dashboard.security import (
    CSRF_FIELD,
    SESSION_COOKIE,
    SESSION_SECONDS,
    Viewer,
    anonymous_key,
    clear_cookie,
    csrf_matches,
    csrf_token,
    set_cookie,
)


class LoginPages:
    """The login page, signing in and signing out."""

    def __init__(self, frame: Frame) -> None:
        self.frame = frame

    def routes(self) -> list[Route]:
        return [
            ("/login", self.login_page, GET),
            ("/login", self.login, POST),
            ("/logout", self.logout, POST),
        ]

    def login_page(self, request: Request) -> Response:
        nxt = forms.local_path(request.query_params.get("next"))
        if isinstance(self.frame.identify(request), Viewer):
            return self.frame.redirect(request, nxt)
        token = csrf_token(anonymous_key(request))
        return self.frame.render(request, None, "login.html", login_csrf=token, next=nxt)

    def login(self, request: Request, posted: PostedForm) -> Response:
        if isinstance(posted, BadForm):
            return self.frame.error(request, None, posted.status, "Refused", posted.message)
        nxt = forms.local_path(posted.get("next"))
        key = anonymous_key(request)
        if not csrf_matches(key, posted.get(CSRF_FIELD)):
            return self.frame.render(
                request,
                None,
                "login.html",
                status=403,
                login_csrf=csrf_token(key),
                next=nxt,
                error="The form was stale (or your browser refuses cookies); try again.",
            )
        token = posted.get("token", "").strip()
        if not token or self.frame.tokens.access(token) is None:
            return self.frame.render(
                request,
                None,
                "login.html",
                status=401,
                login_csrf=csrf_token(key),
                next=nxt,
                error="That token is not one this server accepts.",
            )
        response = self.frame.redirect(request, nxt)
        set_cookie(response, request, SESSION_COOKIE, token, SESSION_SECONDS)
        return response

    def logout(self, request: Request, posted: PostedForm) -> Response:
        found = self.frame.identify(request)
        if (
            isinstance(found, Viewer)
            and not isinstance(posted, BadForm)
            and not found.csrf_ok(posted.get(CSRF_FIELD))
        ):
            return self.frame.error(request, found, 403, "Refused", "Stale form; still signed in.")
        response = self.frame.redirect(request, "/login")
        clear_cookie(response, request, SESSION_COOKIE)
        return response
