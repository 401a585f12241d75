"""The version and the changelog follow the usual conventions: one version
(pyproject.toml's, which the package metadata and ``wheelctl --version``
report), and a CHANGELOG.md in Keep a Changelog form with a section for it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import wheel

ROOT = Path(__file__).resolve().parent.parent
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
CHANGELOG = (ROOT / "CHANGELOG.md").read_text()
# Keep a Changelog 1.1.0: the kinds of change, each a heading under a release.
KINDS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def releases() -> list[str]:
    return re.findall(r"^## \[([^\]]+)\]", CHANGELOG, flags=re.MULTILINE)


def test_the_package_and_the_metadata_have_one_version() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION), VERSION
    assert wheel.__version__ == VERSION


def test_the_changelog_has_a_section_for_the_packages_version() -> None:
    assert VERSION in releases()


def test_the_changelog_opens_with_unreleased_then_versions_newest_first() -> None:
    found = releases()
    assert found[0] == "Unreleased"
    versions = [tuple(int(n) for n in v.split(".")) for v in found[1:]]
    assert versions == sorted(versions, reverse=True)
    assert len(set(versions)) == len(versions)


def test_the_changelog_groups_changes_by_their_kind() -> None:
    kinds = re.findall(r"^### (.+)$", CHANGELOG, flags=re.MULTILINE)
    assert kinds
    assert set(kinds) <= KINDS, set(kinds) - KINDS
