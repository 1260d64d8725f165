"""The NOTIFY channels pgjobs speaks on, and the statements that LISTEN to them."""

from __future__ import annotations

#: Channel that enqueue NOTIFYs (payload: the queue name) and idle workers LISTEN on.
NOTIFY_CHANNEL = "pgjobs"

#: Start of the NOTIFY_CHANNEL payload that ``JOB_CANCEL`` sends for a running job it cancels:
#: "cancel<TAB><job id><TAB><attempt>". A queue name cannot hold a tab (no control characters),
#: so a worker never mistakes one for the other.
CANCEL_NOTICE = "cancel\t"

#: Subscribe this session to NOTIFY_CHANNEL (an identifier, so spelled out rather than bound).
LISTEN_JOBS = f'LISTEN "{NOTIFY_CHANNEL}"'

#: Channel the trigger ``pgjobs_job_ended`` NOTIFYs (payload: the job id) when a watched job
#: enters archived_jobs or dead_letter.
ENDED_CHANNEL = "pgjobs_ended"

#: Subscribe this session to ENDED_CHANNEL.
RESULT_LISTEN = f'LISTEN "{ENDED_CHANNEL}"'

#: Ask for a notification when queued job ``id`` ends (a row already watched is not written).
RESULT_WATCH = "UPDATE queued_jobs SET watched = true WHERE id = %(id)s AND NOT watched"
