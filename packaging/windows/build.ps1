# Build clover.exe and the release zip on Windows (PowerShell 5+ or 7):
#   powershell -ExecutionPolicy Bypass -File packaging\windows\build.ps1
# The -ExecutionPolicy Bypass applies to this one process only; the user's policy is unchanged.
$ErrorActionPreference = "Stop"
$root = Resolve-Path "$PSScriptRoot\..\.."
Set-Location $root
python -m venv .build-venv
.\.build-venv\Scripts\python -m pip install --upgrade pip
.\.build-venv\Scripts\python -m pip install . pyinstaller
$version = (.\.build-venv\Scripts\python -c "import clover_cli; print(clover_cli.__version__)").Trim()
Set-Location "$root\packaging\windows"
..\..\.build-venv\Scripts\pyinstaller --noconfirm --clean --distpath "$root\dist" --workpath "$root\build" clover.spec
& "$root\dist\clover.exe" --version
$zip = "$root\dist\clover-$version-windows-x64.zip"
if (Test-Path $zip) { Remove-Item $zip }
Compress-Archive -Path "$root\dist\clover.exe" -DestinationPath $zip
Get-FileHash $zip -Algorithm SHA256 | Format-List
Write-Host "next: upload $zip to the release, then run packaging\winget\update_manifests.py"
