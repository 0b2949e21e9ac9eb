"""Channel versions (issue 26, storage at the payload floor): the compact form the
saver writes, and the stock form ``export-stock`` turns it back into.

A channel version is an opaque string to LangGraph, with two rules: it is compared with
``>`` (a newer version is a greater string), and the stock saver's
``get_next_version`` parses the part before the first ``.`` as an integer. The stock
form, ``f"{n:032}.{random.random():016}"`` (51 characters), is written ~7 times into
every checkpoint row (``channel_versions`` and ``versions_seen``) and once into every
blob row's key: 40% of a chat checkpoint's row. The compact form is

    ``v`` + one letter giving the counter's number of digits (``a`` = 1 ... ``z`` = 26)
    + the counter in decimal + ``.`` + 8 random URL-safe base-64 characters

(``vc599.k3F9xQ2a``: 14 characters at 3 digits, 20 at 9). The length letter makes a
longer counter sort after a shorter one, so no fixed width (and no zero padding) is
needed. The suffix keeps two forks of one checkpoint (each bumping the same channel to
the same counter) from sharing a blob row, as the stock random fraction does: 48
random bits against its 53.

* **Ordered after every stock version**: ``"v"`` sorts after every digit, so a thread
  the stock saver wrote (or an older release of this package) continues here with
  versions greater than all of its own, and ``max()`` of a mixed map is a compact one;
  compact versions compare among themselves by counter.
* **Never misread silently**: the stock ``get_next_version`` fails on a compact version
  (``int("vc601")`` raises) instead of producing a stock version that would sort
  *below* it (which would make LangGraph take a channel for unchanged and skip the
  nodes it triggers). So an older release, or the stock saver, continuing a thread this
  release wrote fails loudly; ``export-stock`` rewrites every compact version into the
  stock form first (``to_stock``: same counter, 32 digits), and ``compact_versions=False``
  keeps writing the stock form (a fleet mid-upgrade that may still run older releases).
"""

from __future__ import annotations

import random
import re
from base64 import urlsafe_b64encode
from collections.abc import Mapping
from typing import Any

_MAX_DIGITS = 26  # "a".."z"
_COMPACT = re.compile(r"v([a-z])([1-9][0-9]*)\.([0-9A-Za-z_-]*)")
_rand = random.getrandbits


def counter(version: Any) -> int:
    """The counter of a version: compact, stock (``"<n>.<anything>"``), an int, or
    None (0)."""
    if version is None:
        return 0
    if isinstance(version, int):
        return version
    text = str(version)
    if text[:1] == "v":
        return int(text[2 : 2 + ord(text[1]) - 96])
    return int(text.split(".", 1)[0])


def next_compact(current: Any) -> str:
    """The compact version after ``current`` (any form). On LangGraph's critical path
    (once per step): the common case, a compact version, takes the short branch."""
    if type(current) is str and current[:1] == "v":
        n = int(current[2 : 2 + ord(current[1]) - 96]) + 1
    else:
        n = counter(current) + 1
    digits = str(n)
    suffix = urlsafe_b64encode(_rand(48).to_bytes(6, "little")).decode()
    if len(digits) <= _MAX_DIGITS:
        return f"v{chr(96 + len(digits))}{digits}.{suffix}"
    # A stock counter of 27+ digits: the thread keeps the stock form, which still sorts
    # above its own history (a compact one cannot get there: 10^26 bumps).
    return f"{n:032d}.{suffix}"


def is_compact(version: Any) -> bool:
    if not isinstance(version, str):
        return False
    m = _COMPACT.fullmatch(version)
    return m is not None and ord(m.group(1)) - 96 == len(m.group(2))


def to_stock(version: Any) -> Any:
    """The stock form of a compact version (same counter, 32 digits, same suffix); any
    other value unchanged. Order-preserving between versions of one thread: compact
    counters continue from the stock ones they follow."""
    if not is_compact(version):
        return version
    m = _COMPACT.fullmatch(version)
    assert m is not None
    return f"{int(m.group(2)):032d}.{m.group(3)}"


def stock_versions(versions: Mapping[str, Any]) -> dict[str, Any]:
    return {k: to_stock(v) for k, v in versions.items()}


def stock_seen(seen: Mapping[str, Any]) -> dict[str, Any]:
    return {n: stock_versions(s) if isinstance(s, Mapping) else s for n, s in seen.items()}


def has_compact(checkpoint: Mapping[str, Any]) -> bool:
    """Whether a checkpoint's ``channel_versions`` or ``versions_seen`` holds a compact
    version (what ``export-stock`` rewrites)."""
    versions = checkpoint.get("channel_versions")
    if isinstance(versions, Mapping) and any(is_compact(v) for v in versions.values()):
        return True
    seen = checkpoint.get("versions_seen")
    if isinstance(seen, Mapping):
        for s in seen.values():
            if isinstance(s, Mapping) and any(is_compact(v) for v in s.values()):
                return True
    return False
