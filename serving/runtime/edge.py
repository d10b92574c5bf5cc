"""The HTTP edge every ingress shares: the API key check and a body read under a size limit.

The pipeline app's :class:`serving.runtime.ingress.Ingress` and the torch-model app's
ingress (:mod:`serving.model_app.stages`) both inherit it, so a key or a size limit means the
same on either: a key is compared by its hash in constant time; a body is read in chunks and
refused (413) as soon as it passes the limit, before it is all in memory.
"""

from __future__ import annotations

import hmac
from typing import Any

from serving.core.schema import RequestError
from serving.runtime.http_support import key_hash

#: what a request without the right key is told
KEY_MESSAGE = "missing or wrong API key (send it as 'Authorization: Bearer KEY' or 'X-API-Key')"


class HttpEdge:
    """Mixed into an ingress deployment that sets ``max_body`` (bytes) and ``api_key_hash``
    (None: no key)."""

    max_body: int
    api_key_hash: str | None

    def authorized(self, request: Any) -> bool:
        """Whether the request carries the key (``X-API-Key`` or ``Authorization: Bearer``)."""
        if not self.api_key_hash:
            return True
        given = request.headers.get("x-api-key")
        auth = request.headers.get("authorization", "")
        if given is None and auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        return given is not None and hmac.compare_digest(key_hash(given), self.api_key_hash)

    def check_key(self, request: Any) -> None:
        if not self.authorized(request):
            raise RequestError(401, KEY_MESSAGE)

    async def read_body(self, request: Any) -> bytes:
        """The body, refused with 413 once it passes ``max_body`` (a declared length over it is
        refused before a byte is read)."""
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            raise RequestError(413, f"request body of {length} bytes exceeds the {self.max_body}-byte limit")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.max_body:
                raise RequestError(413, f"request body exceeds the {self.max_body}-byte limit")
        return bytes(body)
