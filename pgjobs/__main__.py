from pgjobs.cli import run

run()
