"""What a URL given for an HTTP endpoint must look like, checked once for every caller."""

from __future__ import annotations

from urllib.parse import urlsplit

from dflash_ops.errors import UserError


def check_http_url(url: str, flag: str = "--base-url") -> str:
    """`url` without a trailing slash, or a UserError naming what is wrong with it."""
    try:
        parts = urlsplit(url)
    except ValueError as err:
        raise UserError(
            f"{flag} {url!r} is not a URL ({err}), e.g. http://127.0.0.1:8000"
        ) from None
    try:
        port = parts.port
    except ValueError:
        raise UserError(f"{flag} {url!r}: the port is not a number in 1-65535") from None
    if parts.scheme not in ("http", "https"):
        raise UserError(f"{flag} {url!r}: expected http:// or https://, e.g. http://127.0.0.1:8000")
    if not parts.hostname or port == 0:
        raise UserError(f"{flag} {url!r}: expected a host (and port), e.g. http://127.0.0.1:8000")
    return url.rstrip("/")
