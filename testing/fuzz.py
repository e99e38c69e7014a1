"""How many examples a fuzz property runs: a few under hypothesis's default profile (``make test`` stays fast),
many under the ``long`` profile (``make fuzz``: ``pytest --hypothesis-profile=long``). One test per property,
no ``_long`` twin.

Every property in the suite runs under the ``suite`` profile (loaded here, before pytest loads another): no
per-example deadline and no "too slow" health check. Both are timings: hypothesis's default fails an example
that takes over 200 ms, and on 2 shared cores at a load of 30 one real ``git`` process can take that long.
A property checks what the code does, never how fast."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

SUITE = "suite"
LONG = "long"
settings.register_profile(SUITE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(LONG, parent=settings.get_profile(SUITE), max_examples=2500)
settings.load_profile(SUITE)


def examples(default: int, long: int) -> int:
    """``long`` when the long profile is loaded, else ``default``."""
    return long if settings.default.max_examples == settings.get_profile(LONG).max_examples else default


def fuzz_settings(max_examples: int):
    """A property of the fuzz tests: ``max_examples`` examples, fresh ones each run (no example database), no
    deadline and no health check (the examples run real git)."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
    )


TALLY: dict[str, int] = {}  # outcomes seen, per property (printed with -s; GITLEASE_FUZZ_TALLY=1)


def event(what: str) -> None:
    """Count one outcome ``what`` of the running property."""
    TALLY[what] = TALLY.get(what, 0) + 1


@pytest.fixture(autouse=True)
def tally(request):
    """Outcomes counted afresh for each test (autouse where a fuzz module imports it); printed after it with
    GITLEASE_FUZZ_TALLY=1 (and -s)."""
    TALLY.clear()
    yield
    if os.environ.get("GITLEASE_FUZZ_TALLY"):
        print(f"\n{request.node.name}: {dict(sorted(TALLY.items()))}")
