"""The winget manifests are well-formed and the release script fills them consistently."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from winget_schema import DEFAULT_LOCALE_SCHEMA, INSTALLER_SCHEMA, VERSION_SCHEMA

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "packaging" / "winget" / "manifests"
SCHEMAS = {"version": VERSION_SCHEMA, "installer": INSTALLER_SCHEMA, "defaultLocale": DEFAULT_LOCALE_SCHEMA}


def _load_all(folder: Path) -> dict[str, dict]:
    docs = {}
    for path in sorted(folder.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        docs[doc["ManifestType"]] = doc
    return docs


def test_three_manifests_validate_against_schema() -> None:
    docs = _load_all(MANIFESTS)
    assert set(docs) == {"version", "installer", "defaultLocale"}
    for kind, doc in docs.items():
        jsonschema.validate(doc, SCHEMAS[kind])


def test_manifests_agree_and_describe_a_portable_zip() -> None:
    docs = _load_all(MANIFESTS)
    ids = {d["PackageIdentifier"] for d in docs.values()}
    versions = {d["PackageVersion"] for d in docs.values()}
    assert len(ids) == 1 and len(versions) == 1
    assert docs["version"]["DefaultLocale"] == docs["defaultLocale"]["PackageLocale"]
    inst = docs["installer"]
    assert inst["InstallerType"] == "zip" and inst["NestedInstallerType"] == "portable"
    assert inst["NestedInstallerFiles"] == [{"RelativeFilePath": "clover.exe", "PortableCommandAlias": "clover"}]
    import clover_cli

    assert versions == {clover_cli.__version__}


def test_schema_rejects_a_broken_manifest() -> None:
    doc = _load_all(MANIFESTS)["installer"]
    doc["Installers"][0]["InstallerSha256"] = "xyz"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, INSTALLER_SCHEMA)
    del doc["Installers"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, INSTALLER_SCHEMA)


def test_update_script_fills_version_url_and_hash(tmp_path: Path) -> None:
    folder = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, folder)
    asset = tmp_path / "clover-9.8.7-windows-x64.zip"
    asset.write_bytes(b"PK\x05\x06" + bytes(18))
    url = "https://example.invalid/releases/v9.8.7/clover-9.8.7-windows-x64.zip"
    script = ROOT / "packaging" / "winget" / "update_manifests.py"
    res = subprocess.run(
        [sys.executable, str(script), "--version", "9.8.7", "--url", url, "--asset", str(asset),
         "--manifests", str(folder)],
        capture_output=True, text=True, check=True,
    )
    assert "InstallerSha256" in res.stdout
    docs = _load_all(folder)
    for kind, doc in docs.items():
        assert doc["PackageVersion"] == "9.8.7"
        jsonschema.validate(doc, SCHEMAS[kind])
    installer = docs["installer"]["Installers"][0]
    assert installer["InstallerUrl"] == url
    assert installer["InstallerSha256"] == hashlib.sha256(asset.read_bytes()).hexdigest().upper()


def _script(*args: str) -> subprocess.CompletedProcess:
    script = ROOT / "packaging" / "winget" / "update_manifests.py"
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=60)


def test_check_refuses_the_placeholder_and_a_hash_of_another_file(tmp_path: Path) -> None:
    """The checked-in manifests are templates: --check says no release has been built until the
    release script wrote the zip's real SHA-256, and the script never writes the placeholder."""
    folder = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, folder)
    placeholder = _script("--check", "--manifests", str(folder))
    assert placeholder.returncode == 1 and "placeholder hash" in placeholder.stderr
    assert _script("--url", "https://example.invalid/c.zip", "--manifests", str(folder)).returncode == 2  # no version
    asset = tmp_path / "clover-1.2.3-windows-x64.zip"
    asset.write_bytes(b"PK\x05\x06" + bytes(18))
    filled = _script("--version", "1.2.3", "--url", "https://example.invalid/c.zip", "--asset", str(asset),
                     "--manifests", str(folder))
    assert filled.returncode == 0, filled.stderr
    assert _script("--check", "--asset", str(asset), "--manifests", str(folder)).returncode == 0
    other = tmp_path / "other.zip"
    other.write_bytes(b"PK\x05\x06" + bytes(17) + b"\x01")
    mismatch = _script("--check", "--asset", str(other), "--manifests", str(folder))
    assert mismatch.returncode == 1 and "is not the SHA-256 of" in mismatch.stderr
