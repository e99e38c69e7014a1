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


def installed_bytecode(tmp: Path | str, python: str = sys.executable) -> None:
    """This process and every process it starts from now on read gitlease's bytecode from ``tmp``/pycache
    (compiled here, once)."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
    subprocess.run([python, "-m", "compileall", "-q", str(ROOT / "gitlease")], check=True)
