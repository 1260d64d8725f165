"""What the tests share and that is not a fixture: waiting with a deadline, the three-table
invariant, running `pgjobs` in process or as a subprocess (``helpers``); the rows integration
tests build (``factories``, ``admin_factories``); external workers (``external``); stopping
workers mid-job (``stopping``). The fixtures are in ``tests/conftest.py``, on pgjobs' pytest
plugin."""
