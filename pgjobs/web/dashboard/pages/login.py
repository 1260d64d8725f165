"""Signing in with an API token (which starts a session: the browser keeps its id, never the
token) and out (which ends it). Failed sign-ins are slowed per client address."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from pgjobs.web.dashboard import forms
from pgjobs.web.dashboard.frame import GET, POST, BadForm, Frame, PostedForm, Route
from pgjobs.web.dashboard.security import (
    CSRF_FIELD,
    SESSION_COOKIE,
    Viewer,
    anonymous_key,
    clear_cookie,
    csrf_matches,
    csrf_token,
    set_cookie,
    token_key,
)
from pgjobs.web.throttle import too_many_message


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
        if self.frame.hosted:  # the application signs in, not this form
            return self.frame.not_signed_in(request)
        token = csrf_token(anonymous_key(request))
        return self.frame.render(request, None, "login.html", login_csrf=token, next=nxt)

    def login(self, request: Request, posted: PostedForm) -> Response:
        if self.frame.hosted:
            return self._hosted(request)
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
        frame, client = self.frame, self.frame.client(request)
        if frame.throttled(request, frame.throttle.wait(client)):
            return self._refused(request, 429, _sentence(request.state.retry_after), nxt)
        access = frame.tokens.access(token) if token else None
        if access is None:
            status = 429 if frame.throttled(request, frame.throttle.failed(client)) else 401
            message = "That token is not one this server accepts."
            if status == 429:
                message += " " + _sentence(request.state.retry_after)
            return self._refused(request, status, message, nxt)
        frame.throttle.succeeded(client)
        old = request.cookies.get(SESSION_COOKIE)
        if old:  # a new session, never one whose id the browser held before
            frame.sessions.end(old)
        session_id = frame.sessions.start(access, token_key(token))
        response = frame.redirect(request, nxt)
        set_cookie(
            response, request, SESSION_COOKIE, session_id, int(frame.sessions.lifetime_seconds)
        )
        return response

    def _hosted(self, request: Request) -> Response:
        """Signing in or out with a token, where the application signs browsers in."""
        return self.frame.error(
            request,
            None,
            404,
            "Not found",
            "This dashboard signs in through the application that serves it, not with a token.",
        )

    def _refused(self, request: Request, status: int, message: str, nxt: str) -> Response:
        """The login form again, saying why (401 a wrong token, 429 too many of them)."""
        return self.frame.render(
            request,
            None,
            "login.html",
            status=status,
            login_csrf=csrf_token(anonymous_key(request)),
            next=nxt,
            error=message,
        )

    def logout(self, request: Request, posted: PostedForm) -> Response:
        """Ends the session (a form with a stale CSRF token ends nothing)."""
        if self.frame.hosted:
            return self._hosted(request)
        found = self.frame.identify(request)
        if (
            isinstance(found, Viewer)
            and not isinstance(posted, BadForm)
            and not found.csrf_ok(posted.get(CSRF_FIELD))
        ):
            return self.frame.error(request, found, 403, "Refused", "Stale form; still signed in.")
        session_id = request.cookies.get(SESSION_COOKIE)
        if session_id:
            self.frame.sessions.end(session_id)
        response = self.frame.redirect(request, "/login")
        clear_cookie(response, request, SESSION_COOKIE)
        return response


def _sentence(wait: int) -> str:
    message = too_many_message(wait)
    return f"{message[:1].upper()}{message[1:]}."
