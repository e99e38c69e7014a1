"""Python processes a benchmark starts (hooks, the server hook, agents, ``git lease``) read gitlease as compiled
bytecode, as an installed gitlease does: ``pip install`` compiles it at install time. This machine may set
PYTHONDONTWRITEBYTECODE, and a fresh clone holds no bytecode, so without this every hook run would compile
gitlease from source again (about 40 ms of CPU a process here), a cost no user pays. The caches go to a temporary
PYTHONPYCACHEPREFIX, written once here, never into the tree. Standard library only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def keep_bytecode(folder: Path | str, *, replace: bool = True) -> None:
    """Every process started from now on writes and reads its bytecode in ``folder`` (``replace`` False: unless
    a PYTHONPYCACHEPREFIX is set already)."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if replace or "PYTHONPYCACHEPREFIX" not in os.environ:
        os.environ["PYTHONPYCACHEPREFIX"] = str(folder)


def installed_bytecode(tmp: Path | str, python: str = sys.executable) -> None:
    """Every process started from now on reads gitlease's bytecode from ``tmp``/pycache (compiled here, once)."""
    keep_bytecode(Path(tmp) / "pycache")
    subprocess.run([python, "-m", "compileall", "-q", str(ROOT / "gitlease")], check=True)
