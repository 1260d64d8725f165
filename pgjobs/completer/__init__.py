"""The outcome path of a job: classify -> buffer -> send -> interpret.

Its rooms, bottom to top: ``arrays`` (the array literals the statements cast), ``params`` (each
statement's bind parameters as one typed object), ``outcomes`` (the ``Outcome`` an attempt ended
with, and the buffer of outcomes to send), ``reports`` (outcomes external workers report),
``trip`` (the settle+claim round trip) and ``completer`` (the ``Completer``, one worker's path).
What a worker holds is exported here.
"""

from pgjobs.completer.completer import Claimed, Completer
from pgjobs.completer.outcomes import Outcome
from pgjobs.completer.params import ClaimParams, ClaimStatus

__all__ = ["ClaimParams", "ClaimStatus", "Claimed", "Completer", "Outcome"]
