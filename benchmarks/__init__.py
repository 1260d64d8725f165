"""pgjobs' benchmark suite: every figure beside the leanest raw-SQL reference for the same work.

Run ``python -m benchmarks`` (or ``make bench``) from the repository root; ``--help`` lists the
options. Results print as one table and are saved to ``benchmarks/results/latest.json``.
"""

#: The queue every benchmark job goes to (kept here so that raw.py need not import pgjobs).
QUEUE = "bench"
