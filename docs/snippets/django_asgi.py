# The asgi.py of a Django project: /jobs/... goes to pgjobs, everything else to Django.
# tests/web/test_hosted_django.py serves a Django site through this function.
#
#     application = mounted(
#         "/jobs",
#         pgjobs.web.create_app(app, auth=who, sign_in_url="/accounts/login/"),
#         get_asgi_application(),
#     )


def mounted(prefix, jobs, django_app):
    """An ASGI application: requests under ``prefix`` to ``jobs`` (pgjobs), as Starlette's
    ``mount`` passes them (the prefix as the scope's ``root_path``), the rest to Django; the
    server's start and stop go to pgjobs, which closes its pools (Django takes no lifespan)."""

    async def application(scope, receive, send):
        if scope["type"] == "lifespan":
            return await jobs(scope, receive, send)
        if scope["type"] == "http" and (scope["path"] + "/").startswith(prefix + "/"):
            root = scope.get("root_path", "") + prefix
            return await jobs(dict(scope, root_path=root), receive, send)
        return await django_app(scope, receive, send)

    return application
