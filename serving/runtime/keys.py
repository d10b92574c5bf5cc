"""API keys: generated with enough randomness to be unguessable, stored as an HMAC under a
secret that lives on each machine (never in the app's spec), checked in constant time.

Why an HMAC and a secret apart: the app's spec (Serve's deployment arguments, a Serve config)
is readable by anyone who can read Ray's state; an unsalted SHA-256 of a short key found there
is brute-forced in minutes. Keyed with a secret that is only on the machines, the stored digest
is worthless without it. The secret comes from ``$WILLUMP_KEY_SECRET``, else the file named by
``$WILLUMP_KEY_SECRET_FILE``, else ``~/.willump/key_secret`` (0600 in a 0700 folder), which the
app creates on the machine that starts Ray; every other node of a cluster needs the same one
(a Kubernetes Secret in the KubeRay example).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

#: environment variables naming the secret (its value, or a file holding it)
SECRET_ENV = "WILLUMP_KEY_SECRET"
SECRET_FILE_ENV = "WILLUMP_KEY_SECRET_FILE"
#: random bytes in a generated key and in a generated secret (256 bits; >= 128 asked)
KEY_BYTES = 32
#: a key with fewer characters than this may be guessable (16 random bytes in URL-safe base64)
MIN_KEY_CHARS = 22


def generate_key() -> str:
    """A new API key: ``KEY_BYTES`` random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(KEY_BYTES)


def secret_path() -> Path:
    return Path(os.environ.get(SECRET_FILE_ENV) or Path.home() / ".willump" / "key_secret")


def key_secret(*, create: bool = False) -> bytes:
    """The machine's key secret. ``create``: generate the default file when there is none (the
    machine that starts Ray); otherwise a missing secret is a RuntimeError saying where to put it."""
    value = os.environ.get(SECRET_ENV)
    if value:
        return value.encode()
    path = secret_path()
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        if not create or os.environ.get(SECRET_FILE_ENV):
            raise RuntimeError(f"the app checks API keys but this machine has no key secret: set ${SECRET_ENV}, "
                               f"or ${SECRET_FILE_ENV} to a file holding it, or copy {path} from the machine "
                               "that deployed the app (every node needs the same secret)") from None
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        text = secrets.token_hex(KEY_BYTES)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it first: use theirs
            return path.read_text().strip().encode()
        with os.fdopen(fd, "w") as f:
            f.write(text)
    if not text:
        raise RuntimeError(f"the key secret file {path} is empty")
    return text.encode()


def key_digest(key: str, secret: bytes) -> str:
    """What is stored for ``key``: HMAC-SHA256 under the machine's secret, hex."""
    return hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()


def weak_key_warning(key: str) -> str | None:
    """Why ``key`` may be guessable, or None."""
    if len(key) < MIN_KEY_CHARS:
        return (f"the API key has {len(key)} characters: a short key can be guessed; make one with "
                "`willump keygen` (256 random bits)")
    return None


class KeyCheck:
    """A replica's check of the key a request carries, against a stored digest (its secret read
    where the replica runs) or against the key in ``$key_env`` (a Kubernetes Secret: the digest
    is then made under a secret that never leaves this process)."""

    def __init__(self, digest: str | None = None, key_env: str | None = None):
        if key_env:
            key = os.environ.get(key_env, "")
            if not key:
                raise RuntimeError(f"the app requires the API key in ${key_env}, which is unset or empty in this "
                                   "replica: set it on every node (e.g. from a Secret), or build without "
                                   "--api-key-env")
            self._secret = secrets.token_bytes(KEY_BYTES)
            self._digest: str | None = key_digest(key, self._secret)
        else:
            self._digest = digest
            self._secret = key_secret() if digest else b""

    @property
    def required(self) -> bool:
        return self._digest is not None

    def accepts(self, given: str | None) -> bool:
        if self._digest is None:
            return True
        return given is not None and hmac.compare_digest(key_digest(given, self._secret), self._digest)
