"""Channel versions (issue 26, storage at the payload floor): the compact form the
saver writes, and the stock form ``export-stock`` turns it back into.

A channel version is an opaque string to LangGraph, with two rules: it is compared with
``>`` (a newer version is a greater string), and the stock saver's
``get_next_version`` parses the part before the first ``.`` as an integer. The stock
form, ``f"{n:032}.{random.random():016}"`` (51 characters), is written ~7 times into
every checkpoint row (``channel_versions`` and ``versions_seen``) and once into every
blob row's key: 40% of a chat checkpoint's row. The compact form is

    ``v`` + the counter in 12 decimal digits + ``.`` + 8 random URL-safe base-64 characters

(22 characters). The suffix keeps two forks of one checkpoint (each bumping the same
channel to the same counter) from sharing a blob row, as the stock random fraction
does: 48 random bits against its 53.

* **Ordered after every stock version**: ``"v"`` sorts after every digit, so a thread
  the stock saver wrote (or an older release of this package) continues here with
  versions greater than all of its own, and ``max()`` of a mixed map is a compact one;
  compact versions compare among themselves by counter (fixed width; 10^12 bumps).
* **Never misread silently**: the stock ``get_next_version`` fails on a compact version
  (``int("v000000000601")`` raises) instead of producing a stock version that would
  sort *below* it (which would make LangGraph take a channel for unchanged and skip the
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

_WIDTH = 12
_LIMIT = 10**_WIDTH
_COMPACT = re.compile(r"v([0-9]+)\.([0-9A-Za-z_-]*)")
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
        return int(text[1:].split(".", 1)[0])
    return int(text.split(".", 1)[0])


def next_compact(current: Any) -> str:
    """The compact version after ``current`` (any form). On LangGraph's critical path
    (once per step): the common case, a compact version, takes the short branch."""
    if type(current) is str and current[:1] == "v" and current[_WIDTH + 1 : _WIDTH + 2] == ".":
        n = int(current[1 : _WIDTH + 1]) + 1
    else:
        n = counter(current) + 1
    suffix = urlsafe_b64encode(_rand(48).to_bytes(6, "little")).decode()
    if n < _LIMIT:
        return f"v{n:012d}.{suffix}"
    if not is_compact(current):
        # A stock counter past the compact form's 12 digits (10^12 bumps): the thread
        # keeps the stock form, which still sorts above its own history.
        return f"{n:032d}.{suffix}"
    raise OverflowError(f"channel version counter {n} exceeds the compact form's {_WIDTH} digits")


def is_compact(version: Any) -> bool:
    return isinstance(version, str) and _COMPACT.fullmatch(version) is not None


def to_stock(version: Any) -> Any:
    """The stock form of a compact version (same counter, 32 digits, same suffix); any
    other value unchanged. Order-preserving between versions of one thread: compact
    counters continue from the stock ones they follow."""
    if not isinstance(version, str):
        return version
    m = _COMPACT.fullmatch(version)
    if m is None:
        return version
    return f"{int(m.group(1)):032d}.{m.group(2)}"


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
