"""Fill the winget manifests with a release's version, asset URL and SHA-256.

Usage (after the Windows zip has been uploaded to a release):
    python packaging/winget/update_manifests.py --version 0.2.0 --url https://…/clover-0.2.0-windows-x64.zip
    python packaging/winget/update_manifests.py --version 0.2.0 --url URL --asset dist/clover-0.2.0-windows-x64.zip

With `--asset` the hash is taken from the local file (it must be the uploaded one); otherwise the
asset is downloaded and hashed. The three manifests are rewritten in place; submit them with
`wingetcreate submit` or `komac`.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import urllib.request
from pathlib import Path

MANIFEST_DIR = Path(__file__).resolve().parent / "manifests"
VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+){1,3}([.-][0-9A-Za-z]+)*$")


def sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest().upper()


def sha256_of_url(url: str) -> str:
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 - release asset URL given by the maintainer
        for chunk in iter(lambda: resp.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest().upper()


def _replace_field(text: str, key: str, value: str) -> str:
    pattern = re.compile(rf"^(\s*(?:- )?{key}:\s*).*$", re.MULTILINE)
    if not pattern.search(text):
        raise SystemExit(f"error: field {key} not found in manifest")
    return pattern.sub(lambda m: m.group(1) + value, text)


def update(manifest_dir: Path, version: str, url: str, sha256: str) -> list[Path]:
    """Rewrite PackageVersion in all three manifests and the installer URL and hash."""
    if not VERSION_RE.match(version):
        raise SystemExit(f"error: invalid version {version!r}")
    if not re.fullmatch(r"[0-9A-Fa-f]{64}", sha256):
        raise SystemExit("error: SHA-256 must be 64 hex digits")
    changed = []
    for path in sorted(manifest_dir.glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        text = _replace_field(text, "PackageVersion", version)
        if "ManifestType: installer" in text:
            text = _replace_field(text, "InstallerUrl", url)
            text = _replace_field(text, "InstallerSha256", f'"{sha256.upper()}"')
        path.write_text(text, encoding="utf-8")
        changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", required=True)
    parser.add_argument("--url", required=True, help="download URL of the release zip")
    parser.add_argument("--asset", type=Path, help="local copy of the release zip (skips the download)")
    parser.add_argument("--manifests", type=Path, default=MANIFEST_DIR)
    args = parser.parse_args(argv)
    sha = sha256_of_file(args.asset) if args.asset else sha256_of_url(args.url)
    for path in update(args.manifests, args.version, args.url, sha):
        print(f"updated {path}")
    print(f"InstallerSha256: {sha}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
