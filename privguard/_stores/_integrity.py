"""Digests that make a ledger's journal and state tamper-evident, optionally keyed.

Without a key, digests are SHA-256: they detect corruption and any edit made
without recomputing the digests, but anyone who has privguard can recompute
them. With a key (``PRIVGUARD_LEDGER_KEY``, or a file named by
``PRIVGUARD_LEDGER_KEY_FILE``), digests are HMAC-SHA-256 (RFC 2104): a party
without the key cannot forge a consistent journal. A keyed ledger records a
check value of its key, so it refuses to open with a wrong key or with none.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
from collections.abc import Callable
from typing import Any

from privguard._errors import LedgerStateError

KEY_ENV = "PRIVGUARD_LEDGER_KEY"
KEY_FILE_ENV = "PRIVGUARD_LEDGER_KEY_FILE"
_CHECK_MESSAGE = b"privguard ledger key check v1"


def canonical(value: Any) -> bytes:
    """The one byte encoding every digest is computed over (sorted keys, exact floats)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True,
                      ensure_ascii=False).encode("utf-8")


#: What ``json.dumps(s, ensure_ascii=False)`` writes for a str ``s`` (the same function).
_encode_str: Callable[[str], str] = json.encoder.encode_basestring


def _canonical_flat(parts: tuple[Any, ...]) -> bytes | None:
    """:func:`canonical` of ``list(parts)`` when every part is a str or an int (not a
    bool), built directly: the same bytes (a list's JSON with ``separators=(",", ":")``
    is its items' JSON joined by commas in brackets; a str's is ``_encode_str``, an int's
    ``int.__repr__``, which is what ``json`` calls). None for any other part (the caller
    falls back to :func:`canonical`). A journal head's MAC, the hot path of a commit,
    is over such parts only."""
    out = []
    for part in parts:
        kind = type(part)
        if kind is str:
            out.append(_encode_str(part))
        elif kind is int:
            out.append(int.__repr__(part))
        else:
            return None
    return ("[" + ",".join(out) + "]").encode("utf-8")


def _sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _hmac_sha256_hex(keyed: Any, data: bytes) -> str:
    # HMAC-SHA-256 (RFC 2104): a copy of ``keyed``, an HMAC object that has absorbed the
    # key and nothing else, then the message. The same bytes as hmac.new(key, data,
    # sha256).hexdigest(), without setting the key up again for every journal row.
    h = keyed.copy()
    h.update(data)
    return h.hexdigest()


def key_from_environment() -> bytes | None:
    """The ledger key configured in the environment, or None.

    Raises:
        LedgerStateError: the key file cannot be read, or a key is empty.
    """
    path = os.environ.get(KEY_FILE_ENV)
    if path:
        try:
            with open(path, "rb") as fh:
                key = fh.read().strip()
        except OSError as exc:
            raise LedgerStateError(f"{KEY_FILE_ENV}={path!r} cannot be read ({exc})") from exc
        if not key:
            raise LedgerStateError(f"{KEY_FILE_ENV}={path!r} is empty")
        return key
    text = os.environ.get(KEY_ENV)
    if text is None:
        return None
    if not text.strip():
        raise LedgerStateError(f"{KEY_ENV} is set but empty")
    return text.strip().encode("utf-8")


class Integrity:
    """Digest function of one ledger: HMAC-SHA-256 with a key, SHA-256 without.

    Example:
        >>> a, b = Integrity(None), Integrity(b"secret")
        >>> a.keyed, b.keyed, len(a.digest("x", [1, 2.5]))
        (False, True, 64)
        >>> a.digest("x") != b.digest("x")
        True
    """

    def __init__(self, key: bytes | None) -> None:
        self._key = key
        # bytes -> hex digest, bound once (the journal's replay calls it on every row)
        keyed = None if key is None else hmac.new(key, digestmod=hashlib.sha256)
        self._hex: Callable[[bytes], str] = (
            _sha256_hex if keyed is None else functools.partial(_hmac_sha256_hex, keyed))

    @classmethod
    def from_environment(cls) -> Integrity:
        return cls(key_from_environment())

    @property
    def keyed(self) -> bool:
        return self._key is not None

    def digest(self, *parts: Any) -> str:
        """Hex digest of the canonical encoding of ``parts``."""
        flat = _canonical_flat(parts)
        return self._hex(canonical(list(parts)) if flat is None else flat)

    def digest_text(self, text: str) -> str:
        """Hex digest of an already canonical text (the journal's rows use a compact one)."""
        return self._hex(text.encode("utf-8"))

    def key_check(self) -> str | None:
        """A value that identifies the key without revealing it (None when unkeyed)."""
        if self._key is None:
            return None
        return hmac.new(self._key, _CHECK_MESSAGE, hashlib.sha256).hexdigest()

    def require_matches(self, keyed: bool, check: str | None, where: str) -> None:
        """Fail closed unless this key is the one the ledger was written with.

        A keyed ledger needs its key; an unkeyed one is refused while a key is
        configured, since replacing a keyed file by an unkeyed forgery is the
        attack keys exist to stop.
        """
        if keyed and self._key is None:
            raise LedgerStateError(
                f"{where} is protected by a ledger key: set {KEY_ENV} or {KEY_FILE_ENV}")
        # a str only, and ASCII: compare_digest raises TypeError on a non-ASCII str (review fs)
        if keyed and not (type(check) is str and check.isascii()
                          and hmac.compare_digest(check, str(self.key_check()))):
            raise LedgerStateError(f"{where}: the configured ledger key is not this ledger's key")
        if not keyed and self._key is not None:
            raise LedgerStateError(
                f"{where} is not keyed, but a ledger key is configured ({KEY_ENV} or "
                f"{KEY_FILE_ENV}); refusing it, since an unkeyed copy could replace a keyed "
                "ledger. Unset the key to use this ledger unkeyed")
