"""An HTTP request's JSON body: media type, a size cap whatever the framing, and parsing that fails as a 400.

The cap is checked against `Content-Length` before a byte is read, and again while reading, so a
chunked body (no length declared) is not read past it either. Bounding the size bounds the event
loop's time in the JSON parser too.
"""
from __future__ import annotations

import json
from typing import Any

from starlette.requests import ClientDisconnect, Request

from gateway.validation import RequestError


class BodyTooLarge(Exception):
    """The body is over the cap (HTTP 413): `message` says by how much."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


async def read_json_object(request: Request, max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object; RequestError (param `content-type` or `body`) or BodyTooLarge."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        raise RequestError("content-type", f"must be application/json, got {media_type or 'none'!r}")
    data = _parse(await _read(request, max_bytes))
    if not isinstance(data, dict):
        raise RequestError("body", "must be a JSON object")
    return data


async def _read(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and int(declared) > max_bytes:  # the HTTP parser has checked it is a number
        raise BodyTooLarge(f"body: declares {declared} bytes; at most {max_bytes} are accepted")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_bytes:
                raise BodyTooLarge(f"body: is more than {max_bytes} bytes, the most accepted")
    except ClientDisconnect:
        raise RequestError("body", "the client closed the connection before sending all of it") from None
    return bytes(body)


def _parse(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RequestError("body", f"malformed JSON: {error}") from None
    except RecursionError:
        raise RequestError("body", "JSON nests too deeply") from None
