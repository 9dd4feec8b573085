"""API keys → tenants: the ``api-keys`` authenticator.

Keys reach the stack file only by reference — ``keys_env`` names an environment variable,
``keys_file`` a file — never as literals. Each entry is ``tenant=key``; entries are
separated by commas or newlines, ``#`` starts a comment. A key may be given as
``sha256:<64 hex digits>`` so that the file holds no secret at all.

Keys are kept only as SHA-256 digests, bucketed by their first two bytes. A presented key is
hashed, and every digest in its bucket is compared with :func:`hmac.compare_digest`, with no
early exit: how long a check takes depends only on the digest of what the client sent,
never on how much of a stored key it matched, so timing tells an attacker nothing. API keys are long random strings, so an unsalted fast hash is the right tool (a
password hash such as bcrypt would cost milliseconds per request and buys nothing here).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from pathlib import Path

import attrs

from lamina_hookspecs.errors import AuthenticationError, ConfigError
from lamina_hookspecs.registration import BuildContext
from lamina_hookspecs.types import Principal

TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
HASHED = re.compile(r"sha256:([0-9a-fA-F]{64})")
KEY_ID_HEX = 12
"""A key's id is the first 12 hex digits of its SHA-256: enough to tell keys apart in logs
and limits, far too short to help guess the key."""


@attrs.frozen(kw_only=True)
class ApiKeysOptions:
    """Where the keys are; give one or both."""

    keys_env: str | None = attrs.field(
        default=None, metadata={"help": "environment variable holding tenant=key entries (comma-separated)"})
    keys_file: str | None = attrs.field(
        default=None, metadata={"help": "file of tenant=key entries, one per line (# comments)"})


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_entries(text: str, option: str, source: str) -> dict[bytes, str]:
    """``tenant=key`` entries as ``{sha256(key): tenant}``. Errors name ``option`` and
    ``source`` (the variable or file) and the line, never a key."""
    table: dict[bytes, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        for entry in line.split("#", 1)[0].split(","):
            entry = entry.strip()
            if not entry:
                continue
            tenant, sep, key = (part.strip() for part in entry.partition("="))
            where = f"{source}, line {number}"
            if not sep or not key:
                raise ConfigError(option, f"{where}: expected tenant=key")
            if not TENANT.fullmatch(tenant):
                raise ConfigError(option, f"{where}: tenant {tenant!r} must be 1-64 of A-Z a-z 0-9 . _ -")
            hashed = HASHED.fullmatch(key)
            digest = bytes.fromhex(hashed.group(1)) if hashed else _digest(key)
            if digest in table:
                raise ConfigError(option, f"{where}: the same key is given twice")
            table[digest] = tenant
    return table


class ApiKeys:
    """Authenticates bearer tokens against a table of key digests."""

    def __init__(self, table: dict[bytes, str]) -> None:
        self._buckets: dict[bytes, list[tuple[bytes, str]]] = {}
        for digest, tenant in table.items():
            self._buckets.setdefault(digest[:2], []).append((digest, tenant))

    def authenticate(self, credential: str | None) -> Principal:
        if not credential:
            raise AuthenticationError("missing API key: send it as 'Authorization: Bearer <key>'",
                                      code="missing_api_key")
        digest = _digest(credential)
        tenant = None
        for stored, owner in self._buckets.get(digest[:2], ()):
            if hmac.compare_digest(stored, digest):
                tenant = owner
        if tenant is None:
            raise AuthenticationError("invalid API key", code="invalid_api_key")
        return Principal(tenant=tenant, key_id=digest.hex()[:KEY_ID_HEX])


def build_api_keys(options: ApiKeysOptions, context: BuildContext) -> ApiKeys:
    """Bearer API keys mapped to tenants, read from an environment variable or a file."""
    table: dict[bytes, str] = {}
    if options.keys_env is None and options.keys_file is None:
        raise ConfigError("keys_env", "give keys_env or keys_file: where the tenant=key entries are")
    sources = []
    if options.keys_env is not None:
        value = os.environ.get(options.keys_env)
        if value is None:
            raise ConfigError("keys_env", f"environment variable {options.keys_env} is not set")
        sources.append((parse_entries(value, "keys_env", f"${options.keys_env}"), "keys_env"))
    if options.keys_file is not None:
        try:
            text = Path(options.keys_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError("keys_file", f"cannot read {options.keys_file}: {exc.strerror}") from None
        sources.append((parse_entries(text, "keys_file", options.keys_file), "keys_file"))
    for entries, source in sources:
        if table.keys() & entries.keys():
            raise ConfigError(source, "a key is given both in keys_env and keys_file")
        table.update(entries)
    if not table:
        raise ConfigError(sources[0][1], "no keys: every request would be refused")
    return ApiKeys(table)
