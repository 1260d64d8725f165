"""The statuses a job can have, each spelled once."""

from __future__ import annotations

from pgjobs.models import ArchivedStatus, JobStatus


def test_every_archived_status_is_a_job_status():
    assert [JobStatus(status) for status in ArchivedStatus] == [
        JobStatus.SUCCEEDED,
        JobStatus.CANCELLED,
        JobStatus.EXPIRED,
    ]
    assert JobStatus.CANCELLED.value == ArchivedStatus.CANCELLED.value
