"""pgjobs inside the frameworks applications are written with: FastAPI (async, SQLAlchemy),
Django, and a plain script. Each runs in the test suite
(tests/integration/docs/test_integrations.py).
"""
