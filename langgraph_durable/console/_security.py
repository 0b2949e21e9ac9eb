"""The console's safety rules: read-only unless actions are enabled, a token to sign
in, a CSRF token per session checked on every POST.

Sessions live in the console process (a restart signs everyone out). The cookie is a
random session id, ``HttpOnly`` and ``SameSite=Strict``; the CSRF token is a second
random value stored with the session and rendered into every action form."""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

COOKIE = "lgd_console"
SESSION_TTL = 12 * 3600.0


@dataclass
class Session:
    sid: str
    csrf: str
    actor: str
    created: float = field(default_factory=time.monotonic)
    flash: list[str] = field(default_factory=list)


class Sessions:
    """Signed-in operators, by session id."""

    def __init__(self, token: str) -> None:
        self.token = token
        self._lock = threading.Lock()
        self._by_id: dict[str, Session] = {}

    def check_token(self, candidate: str | None) -> bool:
        return bool(candidate) and hmac.compare_digest(
            str(candidate).encode(), self.token.encode()
        )

    def create(self, actor: str) -> Session:
        s = Session(secrets.token_urlsafe(24), secrets.token_urlsafe(24), actor)
        with self._lock:
            now = time.monotonic()
            for sid in [k for k, v in self._by_id.items() if now - v.created > SESSION_TTL]:
                del self._by_id[sid]
            self._by_id[s.sid] = s
        return s

    def get(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        with self._lock:
            s = self._by_id.get(sid)
            if s is not None and time.monotonic() - s.created > SESSION_TTL:
                del self._by_id[sid]
                return None
            return s

    def drop(self, sid: str | None) -> None:
        with self._lock:
            self._by_id.pop(sid or "", None)


def csrf_ok(session: Session | None, form: Any) -> bool:
    if session is None:
        return False
    sent = form.get("csrf") if form is not None else None
    return bool(sent) and hmac.compare_digest(str(sent).encode(), session.csrf.encode())


def new_token() -> str:
    return secrets.token_urlsafe(18)
