"""The nodes' secrets key: its file (made once, 0600, JSON or bare base64),
its id, and AES-GCM seals bound to a secret's tenant, name and version."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest

from wheel.errors import InvalidArgument
from wheel.node import SecretsKey
from wheel.node._secrets_key import SecretsKeyError


def test_a_seal_opens_only_for_its_own_tenant_name_and_version() -> None:
    key = SecretsKey.generate()
    sealed = key.seal(b"k" * 32, "acme", "hook", 3)
    assert b"k" * 32 not in sealed
    assert key.open(sealed, "acme", "hook", 3) == b"k" * 32
    for other in (("zeta", "hook", 3), ("acme", "hook2", 3), ("acme", "hook", 4)):
        with pytest.raises(SecretsKeyError, match=key.key_id):
            key.open(sealed, *other)


def test_two_seals_of_one_key_differ() -> None:
    key = SecretsKey.generate()
    assert key.seal(b"x" * 32, "a", "b", 1) != key.seal(b"x" * 32, "a", "b", 1)


def test_another_key_cannot_open_a_seal() -> None:
    one, two = SecretsKey.generate(), SecretsKey.generate()
    assert one.key_id != two.key_id
    with pytest.raises(SecretsKeyError):
        two.open(one.seal(b"x" * 32, "a", "b", 1), "a", "b", 1)


def test_load_or_create_makes_a_private_file_once(tmp_path: Path) -> None:
    path = tmp_path / "secrets.key"
    made = SecretsKey.load_or_create(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = SecretsKey.load_or_create(path)
    assert again.key_id == made.key_id
    raw = base64.b64decode(json.loads(path.read_text())["key"])
    assert len(raw) == 32
    # The id is a hash, not the key, and the repr shows only the id.
    assert base64.b64encode(raw).decode() not in repr(made) + made.key_id
    assert list(tmp_path.iterdir()) == [path]


def test_a_bare_base64_file_is_the_same_key_as_its_json(tmp_path: Path) -> None:
    raw = os.urandom(32)
    (tmp_path / "a.json").write_text(json.dumps({"key": base64.b64encode(raw).decode()}))
    (tmp_path / "b.txt").write_text(base64.b64encode(raw).decode() + "\n")
    a = SecretsKey.load(tmp_path / "a.json")
    b = SecretsKey.load(tmp_path / "b.txt")
    assert a.key_id == b.key_id
    assert b.open(a.seal(b"v" * 24, "t", "n", 1), "t", "n", 1) == b"v" * 24


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("not base64!", "not base64"),
        ('{"nokey": 1}', "JSON without"),
        (base64.b64encode(b"short").decode(), "5 bytes"),
    ],
)
def test_a_bad_key_file_is_refused_naming_the_flag(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "bad.key"
    path.write_text(text)
    with pytest.raises(InvalidArgument, match=why) as info:
        SecretsKey.load(path)
    assert info.value.field == "secrets_key_file"


def test_a_missing_key_file_is_refused_naming_the_flag(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument) as info:
        SecretsKey.load(tmp_path / "absent.key")
    assert info.value.field == "secrets_key_file"
