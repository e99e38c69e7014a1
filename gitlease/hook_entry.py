"""Kept for hooks installed before the hooks' entry moved to ``gitlease.enforce.entry``: they run
``from gitlease.hook_entry import main``. ``git lease install-hooks`` writes the new path."""

from gitlease.enforce.entry import main

__all__ = ["main"]
