"""What keeps the dashboard safe by default.

* **Where it listens.** Loopback unless ``dashboard_address`` says otherwise, and
  then only with ``dashboard_auth`` (``StoreConfig`` refuses the settings otherwise,
  as it refuses TCP beyond loopback without CURVE).
* **Who may look.** With ``dashboard_auth``, every request must authenticate
  (``Authority``): the file holds either one token (one line, no colon), sent as
  ``Authorization: Bearer TOKEN`` or as the password of HTTP basic auth under any
  name, or users, one ``name:password`` line each, for HTTP basic auth. Blank lines
  and lines starting with ``#`` are skipped. Without it (loopback) anyone who can
  reach 127.0.0.1 may look.
* **Who may write.** Offset resets and test sends only with
  ``dashboard_allow_writes``; each write is logged (``log_write``) with who made it:
  the user's name, ``token``, or ``anonymous`` and the client's address. A write whose
  ``Origin`` is another site is refused (a page elsewhere cannot post to a dashboard on
  this host through the operator's browser).
* **What it accepts** (``Guard``, an ASGI middleware): no path with a ``..``
  segment (plain or percent-encoded), no request body over ``max_body_bytes``; both
  answered 4xx with a sentence before any route runs.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
import re

log = logging.getLogger("rocketstore.console.writes")

_DOT_DOT = re.compile(rb"(^|/)(\.|%2e){2}(/|$)", re.IGNORECASE)


class AuthFileError(ValueError):
    """``dashboard_auth`` names a file that is missing, unreadable or empty."""


class Authority:
    """The credentials of ``dashboard_auth``; ``who(header)`` names the caller of a
    request's ``Authorization`` header, or None when it does not authenticate."""

    def __init__(self, token: str | None, users: dict[str, str]):
        self.token, self.users = token, users

    @classmethod
    def from_file(cls, path: str) -> "Authority":
        try:
            with open(path, encoding="utf-8") as f:
                lines = [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]
        except (OSError, UnicodeDecodeError) as e:
            raise AuthFileError(f"dashboard_auth {path}: cannot read it: {e}") from None
        if not lines:
            raise AuthFileError(f"dashboard_auth {path}: holds no token and no user")
        if len(lines) == 1 and ":" not in lines[0]:
            return cls(lines[0], {})
        bad = [i + 1 for i, ln in enumerate(lines) if ":" not in ln]
        if bad:
            raise AuthFileError(f"dashboard_auth {path}: line {bad[0]} is not name:password")
        return cls(None, dict(ln.split(":", 1) for ln in lines))

    def who(self, header: str | None) -> str | None:
        scheme, _, value = (header or "").partition(" ")
        if scheme.lower() == "bearer" and self.token is not None:
            return "token" if hmac.compare_digest(value.strip(), self.token) else None
        if scheme.lower() != "basic":
            return None
        try:
            name, _, password = base64.b64decode(value.strip(), validate=True).decode(
                "utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        if self.token is not None:
            return f"{name or 'token'} (token)" if hmac.compare_digest(
                password, self.token) else None
        expected = self.users.get(name)
        if expected is not None and hmac.compare_digest(password, expected):
            return name
        return None


def log_write(who: str, action: str, **details: object) -> None:
    """One line per write the dashboard made, naming who made it."""
    log.warning("dashboard write by %s: %s %s", who, action,
                json.dumps(details, sort_keys=True, default=str))


class Guard:
    """ASGI middleware: refuses a path with a ``..`` segment (400), a body larger than
    ``max_body_bytes`` (413, by its Content-Length or as it streams in), and, with an
    ``authority``, any request that does not authenticate (401, asking for basic auth).
    The caller's name goes in ``scope["state"]["who"]``."""

    def __init__(self, app, max_body_bytes: int, authority: Authority | None = None):
        self.app, self.max_body_bytes, self.authority = app, max_body_bytes, authority

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope["headers"]}
        raw = scope.get("raw_path") or scope["path"].encode()
        if _DOT_DOT.search(raw.split(b"?", 1)[0]) or _DOT_DOT.search(scope["path"].encode()):
            return await _refuse(send, 400, "a path may not hold a '..' segment")
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            return await _refuse(send, 413, f"the request body ({int(length)} bytes) is over "
                                            f"the dashboard's limit of {self.max_body_bytes}")
        who = None
        if self.authority is not None:
            who = self.authority.who(headers.get("authorization"))
            if who is None:
                return await _refuse(send, 401, "this dashboard needs a login (dashboard_auth)",
                                     [(b"www-authenticate", b'Basic realm="rocketstore"')])
        client = scope.get("client") or ("?", 0)
        scope.setdefault("state", {})["who"] = who or f"anonymous@{client[0]}"
        return await self.app(scope, self._bounded(receive, send), send)

    def _bounded(self, receive, send):
        seen = 0
        limit = self.max_body_bytes

        async def bounded_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message
        return bounded_receive


class BodyTooLarge(Exception):
    """A body that streamed in past the limit (no Content-Length said so before)."""

    def __init__(self, limit: int):
        super().__init__(f"the request body is over the dashboard's limit of {limit} bytes")


async def _refuse(send, status: int, message: str, extra: list | None = None) -> None:
    body = json.dumps({"error": message, "status": status}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())] + (extra or [])})
    await send({"type": "http.response.body", "body": body})


def same_origin(origin: str | None, host: str | None) -> bool:
    """Whether a write's ``Origin`` (absent: a non-browser client) is this dashboard."""
    if not origin:
        return True
    return origin.split("://", 1)[-1].rstrip("/") == (host or "")
