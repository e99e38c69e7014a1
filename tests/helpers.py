"""Test helpers (kept for the tests that import them from here): the shared ones live in testing/."""

from testing.fleet import Fleet

__all__ = ["Fleet"]
