"""The required structure of winget manifests (schema v1.9.0), as JSON Schema.

Written by hand from Microsoft's published manifest schemas (winget-cli,
schemas/JSON/manifests/v1.9.0: manifest.version, manifest.installer, manifest.defaultLocale):
the required fields, patterns, enums and length limits that apply to our three files. The
published files are not vendored here; this is our own transcription of the rules we rely on.
"""

PACKAGE_IDENTIFIER = {
    "type": "string",
    "maxLength": 128,
    "pattern": r'^[^\.\s\\/:\*\?"<>\|\x01-\x1f]{1,32}(\.[^\.\s\\/:\*\?"<>\|\x01-\x1f]{1,32}){1,7}$',
}
PACKAGE_VERSION = {"type": "string", "maxLength": 128, "pattern": r'^[^\\/:\*\?"<>\|\x01-\x1f]+$'}
LOCALE = {"type": "string", "maxLength": 20,
          "pattern": r"^([a-zA-Z]{2,3}|[iI]-[a-zA-Z]+|[xX]-[a-zA-Z]{1,8})(-[a-zA-Z]{1,8})*$"}
_V = r"(0|[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
MANIFEST_VERSION = {"type": "string", "pattern": rf"^{_V}(\.{_V}){{2}}$"}
URL = {"type": "string", "maxLength": 2048, "pattern": r"^([Hh][Tt][Tt][Pp][Ss]?)://.+$"}
SHA256 = {"type": "string", "pattern": r"^[A-Fa-f0-9]{64}$"}

VERSION_SCHEMA = {
    "type": "object",
    "required": ["PackageIdentifier", "PackageVersion", "DefaultLocale", "ManifestType", "ManifestVersion"],
    "properties": {
        "PackageIdentifier": PACKAGE_IDENTIFIER,
        "PackageVersion": PACKAGE_VERSION,
        "DefaultLocale": LOCALE,
        "ManifestType": {"const": "version"},
        "ManifestVersion": MANIFEST_VERSION,
    },
}

INSTALLER_TYPES = ["msix", "msi", "appx", "exe", "zip", "inno", "nullsoft", "wix", "burn", "pwa", "portable"]
NESTED_TYPES = ["msix", "msi", "appx", "exe", "inno", "nullsoft", "wix", "burn", "portable"]
_INSTALLER_FIELDS = {
    "InstallerType": {"enum": INSTALLER_TYPES},
    "NestedInstallerType": {"enum": NESTED_TYPES},
    "NestedInstallerFiles": {
        "type": "array", "maxItems": 1024,
        "items": {
            "type": "object",
            "required": ["RelativeFilePath"],
            "properties": {
                "RelativeFilePath": {"type": "string", "minLength": 1, "maxLength": 512},
                "PortableCommandAlias": {"type": "string", "minLength": 1, "maxLength": 40},
            },
        },
    },
    "InstallModes": {"type": "array", "items": {"enum": ["interactive", "silent", "silentWithProgress"]}},
    "UpgradeBehavior": {"enum": ["install", "uninstallPrevious", "deny"]},
    "Commands": {"type": "array", "maxItems": 16, "items": {"type": "string", "minLength": 1, "maxLength": 40}},
    "MinimumOSVersion": {"type": "string", "pattern": rf"^{_V}(\.{_V}){{0,3}}$"},
}
INSTALLER_SCHEMA = {
    "type": "object",
    "required": ["PackageIdentifier", "PackageVersion", "Installers", "ManifestType", "ManifestVersion"],
    "properties": {
        "PackageIdentifier": PACKAGE_IDENTIFIER,
        "PackageVersion": PACKAGE_VERSION,
        "ManifestType": {"const": "installer"},
        "ManifestVersion": MANIFEST_VERSION,
        **_INSTALLER_FIELDS,
        "Installers": {
            "type": "array", "minItems": 1, "maxItems": 1024,
            "items": {
                "type": "object",
                "required": ["Architecture", "InstallerUrl", "InstallerSha256"],
                "properties": {
                    "Architecture": {"enum": ["x86", "x64", "arm", "arm64", "neutral"]},
                    "InstallerUrl": URL,
                    "InstallerSha256": SHA256,
                    **_INSTALLER_FIELDS,
                },
            },
        },
    },
}

DEFAULT_LOCALE_SCHEMA = {
    "type": "object",
    "required": ["PackageIdentifier", "PackageVersion", "PackageLocale", "Publisher", "PackageName", "License",
                 "ShortDescription", "ManifestType", "ManifestVersion"],
    "properties": {
        "PackageIdentifier": PACKAGE_IDENTIFIER,
        "PackageVersion": PACKAGE_VERSION,
        "PackageLocale": LOCALE,
        "Publisher": {"type": "string", "minLength": 2, "maxLength": 256},
        "PackageName": {"type": "string", "minLength": 2, "maxLength": 256},
        "License": {"type": "string", "minLength": 3, "maxLength": 512},
        "ShortDescription": {"type": "string", "minLength": 3, "maxLength": 256},
        "Description": {"type": "string", "minLength": 3, "maxLength": 10000},
        "Moniker": {"type": "string", "minLength": 1, "maxLength": 40, "pattern": r"^\S+$"},
        "Tags": {"type": "array", "maxItems": 16,
                 "items": {"type": "string", "minLength": 1, "maxLength": 40, "pattern": r"^\S+$"}},
        "ManifestType": {"const": "defaultLocale"},
        "ManifestVersion": MANIFEST_VERSION,
    },
}
