"""How many examples a fuzz property runs: a few under hypothesis's default profile (``make test`` stays fast),
many under the ``long`` profile (``make fuzz``: ``pytest --hypothesis-profile=long``). One test per property,
no ``_long`` twin."""

from __future__ import annotations

from hypothesis import settings

LONG = "long"
settings.register_profile(LONG, max_examples=2500, deadline=None)


def examples(default: int, long: int) -> int:
    """``long`` when the long profile is loaded, else ``default``."""
    return long if settings.default.max_examples == settings.get_profile(LONG).max_examples else default
