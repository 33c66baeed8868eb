# Build clover.exe, the release zip and the winget manifests' hash on Windows (PowerShell 5+ or 7):
#   powershell -ExecutionPolicy Bypass -File packaging\windows\build.ps1
#   powershell -ExecutionPolicy Bypass -File packaging\windows\build.ps1 -Gpu    (the GPU folder build)
# The -ExecutionPolicy Bypass applies to this one process only; the user's policy is unchanged.
# clover is installed into a fresh venv (not editable), so PyInstaller collects the installed
# packages: clover_cli and clover_runtime with their data (demo model, templates, web page).
param([switch]$Gpu)
$ErrorActionPreference = "Stop"
$root = Resolve-Path "$PSScriptRoot\..\.."
Set-Location $root
python -m venv .build-venv
.\.build-venv\Scripts\python -m pip install --upgrade pip
if ($Gpu) {
    # The CUDA build of torch from PyTorch's index (PyPI's Windows torch is CPU-only), then clover.
    .\.build-venv\Scripts\python -m pip install torch --index-url https://download.pytorch.org/whl/cu128
    $env:CLOVER_PYI_GPU = "1"
} else {
    Remove-Item Env:\CLOVER_PYI_GPU -ErrorAction SilentlyContinue
}
.\.build-venv\Scripts\python -m pip install . pyinstaller
$version = (.\.build-venv\Scripts\python -c "import clover_cli; print(clover_cli.__version__)").Trim()
.\.build-venv\Scripts\pyinstaller --noconfirm --clean --distpath "$root\dist" --workpath "$root\build" `
    "$root\packaging\windows\clover.spec"
if ($Gpu) {
    & "$root\dist\clover-gpu\clover.exe" --version
    & "$root\dist\clover-gpu\clover.exe" doctor
    $zip = "$root\dist\clover-$version-windows-x64-cuda.zip"
    if (Test-Path $zip) { Remove-Item $zip }
    Compress-Archive -Path "$root\dist\clover-gpu\*" -DestinationPath $zip
    Write-Host "built $zip (the GPU variant is not in the winget manifests)"
    exit 0
}
& "$root\dist\clover.exe" --version
& "$root\dist\clover.exe" run demo "What is 2 + 2?" --no-think -n 32
$zip = "$root\dist\clover-$version-windows-x64.zip"
if (Test-Path $zip) { Remove-Item $zip }
Compress-Archive -Path "$root\dist\clover.exe" -DestinationPath $zip
$url = "https://github.com/clover-cli/clover/releases/download/v$version/clover-$version-windows-x64.zip"
.\.build-venv\Scripts\python packaging\winget\update_manifests.py --version $version --url $url --asset $zip
.\.build-venv\Scripts\python packaging\winget\update_manifests.py --check --asset $zip
Write-Host "next: upload $zip as $url, then submit packaging\winget\manifests (wingetcreate submit or komac)"
