"""Entry script for the frozen clover.exe (PyInstaller)."""

from clover_cli.app import main

if __name__ == "__main__":
    main()
