"""API keys: generated unguessable, stored as an HMAC under a secret kept on the machines (not
in the spec), checked in constant time, read where a replica runs (serving.runtime.keys)."""

from __future__ import annotations

import base64
import hashlib
import os
import stat

import pytest

from serving.runtime import keys
from serving.runtime.keys import KeyCheck, generate_key, key_digest, key_secret, weak_key_warning


@pytest.fixture
def secret_file(tmp_path, monkeypatch):
    monkeypatch.delenv(keys.SECRET_ENV, raising=False)
    monkeypatch.delenv(keys.SECRET_FILE_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path / ".willump" / "key_secret"


def test_a_generated_key_has_256_random_bits_and_is_never_the_same():
    made = {generate_key() for _ in range(100)}
    assert len(made) == 100
    key = made.pop()
    assert len(base64.urlsafe_b64decode(key + "=")) == keys.KEY_BYTES >= 16  # >= 128 bits asked
    assert weak_key_warning(key) is None
    assert "willump keygen" in weak_key_warning("s3cret")


def test_the_secret_is_made_once_private_and_then_reused(secret_file):
    with pytest.raises(RuntimeError, match="no key secret"):
        key_secret()  # a replica never invents one: its digest would not match
    made = key_secret(create=True)
    assert secret_file.read_bytes() == made and len(bytes.fromhex(made.decode())) == keys.KEY_BYTES
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(secret_file.parent.stat().st_mode) == 0o700
    assert key_secret() == key_secret(create=True) == made


def test_the_secret_can_come_from_the_environment_or_a_mounted_file(secret_file, tmp_path, monkeypatch):
    mounted = tmp_path / "mounted"
    mounted.write_text("from-a-secret\n")
    monkeypatch.setenv(keys.SECRET_FILE_ENV, str(mounted))
    assert key_secret() == b"from-a-secret"
    monkeypatch.setenv(keys.SECRET_FILE_ENV, str(tmp_path / "missing"))
    with pytest.raises(RuntimeError, match="WILLUMP_KEY_SECRET"):
        key_secret(create=True)  # a named file is never created in its place
    monkeypatch.setenv(keys.SECRET_ENV, "from-the-env")
    assert key_secret() == b"from-the-env"
    assert not secret_file.exists()


def test_the_stored_digest_is_useless_without_the_secret(secret_file):
    secret = key_secret(create=True)
    digest = key_digest("s3cret", secret)
    assert digest != hashlib.sha256(b"s3cret").hexdigest()  # no dictionary of plain hashes finds it
    assert digest != key_digest("s3cret", b"another machine's secret")
    check = KeyCheck(digest)
    assert check.required and check.accepts("s3cret")
    assert not check.accepts("s3cret ") and not check.accepts("") and not check.accepts(None)
    assert KeyCheck().accepts(None) and not KeyCheck().required


def test_a_replica_without_the_secret_refuses_to_start(secret_file):
    digest = key_digest("k", b"secret on the deploying machine")
    with pytest.raises(RuntimeError, match="copy .*key_secret"):
        KeyCheck(digest)


def test_a_replica_reads_its_key_where_it_runs_and_will_not_start_without_it(secret_file, monkeypatch):
    """`willump build --api-key-env VAR` writes the variable's name, not the key: each replica
    reads the key from its own environment (a Kubernetes Secret) and refuses to start without it;
    no secret file is needed (the digest is made under a secret that stays in the process)."""
    monkeypatch.setenv("WILLUMP_TEST_KEY", "s3cret")
    check = KeyCheck(None, "WILLUMP_TEST_KEY")
    assert check.accepts("s3cret") and not check.accepts("s3cre")
    assert not secret_file.exists()
    monkeypatch.setenv("WILLUMP_TEST_KEY", "")
    with pytest.raises(RuntimeError, match="WILLUMP_TEST_KEY"):
        KeyCheck(None, "WILLUMP_TEST_KEY")
    monkeypatch.delenv("WILLUMP_TEST_KEY")
    with pytest.raises(RuntimeError, match="unset or empty"):
        KeyCheck("stored", "WILLUMP_TEST_KEY")
    assert os.environ.get(keys.SECRET_ENV) is None


def test_willump_keygen_prints_a_fresh_key(capsys):
    from serving.cli import main

    assert main(["keygen"]) == 0 and main(["keygen", "--env", "WILLUMP_API_KEY"]) == 0
    plain, export = capsys.readouterr().out.splitlines()
    assert weak_key_warning(plain) is None and export.startswith("export WILLUMP_API_KEY=")
    assert export.split("=", 1)[1] != plain
    with pytest.raises(SystemExit):
        main(["keygen", "--env", "not a name"])
