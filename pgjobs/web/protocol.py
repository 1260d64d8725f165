"""The HTTP/1.1 protocol `pgjobs serve` runs uvicorn with: uvicorn's own (h11), answering a
request it cannot parse (a bad request line, a bad header, an invalid chunked body, headers
beyond h11's size limit) with a 400 in the API's one error shape instead of uvicorn's plain text.

Such a request never reaches the application, so only the protocol can answer it. What remains
uvicorn's: the 503 of ``limit_concurrency`` (plain text ``Service Unavailable``) and a request
that ends the connection before a full request line (no answer at all).
"""

from __future__ import annotations

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from pgjobs.web.errors import error_body

#: The body of every answer to a request that is not HTTP.
BAD_REQUEST_BODY = error_body(
    "bad_request",
    "the request is not valid HTTP/1.1 (request line, headers or chunked body): it was not read",
)


class JsonErrorsH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, with its 400 answer in the one error shape.

    Example: ``uvicorn.run(app, http=JsonErrorsH11Protocol)``
    """

    def send_400_response(self, msg: str) -> None:
        if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            # An answer is under way already: nothing else can be said on this connection.
            self.transport.close()
            return
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(BAD_REQUEST_BODY)).encode()),
            (b"connection", b"close"),
        ]
        for event in (
            h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
            h11.Data(data=BAD_REQUEST_BODY),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event))
        self.transport.close()
