"""Fill the winget manifests with a release's version, asset URL and SHA-256.

Usage (after the Windows zip has been uploaded to a release):
    python packaging/winget/update_manifests.py --version 0.2.0 --url https://…/clover-0.2.0-windows-x64.zip
    python packaging/winget/update_manifests.py --version 0.2.0 --url URL --asset dist/clover-0.2.0-windows-x64.zip

With `--asset` the hash is taken from the local file (it must be the uploaded one); otherwise the
asset is downloaded and hashed. The three manifests are rewritten in place; submit them with
`wingetcreate submit` or `komac`. packaging/windows/build.ps1 runs this with the zip it built.

    python packaging/winget/update_manifests.py --check [--asset ZIP]

fails while the manifests carry the placeholder hash (no release has been built: the checked-in
manifests are templates) or, with `--asset`, a hash other than that file's; run it before a submit.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import urllib.request
from pathlib import Path

MANIFEST_DIR = Path(__file__).resolve().parent / "manifests"
PLACEHOLDER = "0" * 64  # the checked-in manifests' hash until a release fills in the real one
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
    if sha256 == PLACEHOLDER:
        raise SystemExit("error: the SHA-256 is the placeholder: hash the release zip (--asset or --url)")
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


def installer_hashes(manifest_dir: Path) -> list[str]:
    """The InstallerSha256 values of the installer manifest, upper-case."""
    hashes = []
    for path in sorted(manifest_dir.glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        if "ManifestType: installer" in text:
            hashes += [h.upper() for h in re.findall(r'InstallerSha256:\s*"?([0-9A-Fa-f]{64})"?', text)]
    return hashes


def check(manifest_dir: Path, asset: Path | None) -> int:
    """0 when every installer hash is a real one (and, with `asset`, that file's); else 1 with the reason."""
    hashes = installer_hashes(manifest_dir)
    if not hashes:
        print("error: no InstallerSha256 in the manifests", file=sys.stderr)
        return 1
    if PLACEHOLDER in hashes:
        print("error: the manifests carry the placeholder hash: no release has been built "
              "(run packaging/windows/build.ps1, or this script with --version, --url and --asset)", file=sys.stderr)
        return 1
    if asset is not None and set(hashes) != {sha256_of_file(asset)}:
        print(f"error: the manifests' hash is not the SHA-256 of {asset}", file=sys.stderr)
        return 1
    print(f"InstallerSha256: {', '.join(hashes)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version")
    parser.add_argument("--url", help="download URL of the release zip")
    parser.add_argument("--asset", type=Path, help="local copy of the release zip (skips the download)")
    parser.add_argument("--manifests", type=Path, default=MANIFEST_DIR)
    parser.add_argument("--check", action="store_true", help="only check the manifests' hash (see above)")
    args = parser.parse_args(argv)
    if args.check:
        return check(args.manifests, args.asset)
    if not args.version or not args.url:
        parser.error("--version and --url are required (or --check)")
    sha = sha256_of_file(args.asset) if args.asset else sha256_of_url(args.url)
    for path in update(args.manifests, args.version, args.url, sha):
        print(f"updated {path}")
    print(f"InstallerSha256: {sha}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
