"""Where gitlease keeps a store's cache files in a repository's shared folder: one naming rule,
``<folder>/cache/<prefix>-<hash of the store's name>.<ext>``, for every cache kept per store (the trust file,
the replay memory, verdicts, audit heads) and the last listing (``<hash>.marshal``). Standard library only,
and the cheapest part of it (``_sha1``, not ``hashlib``): the hooks name these files too."""

from __future__ import annotations

import os


def store_hash(store_name: str) -> str:
    """16 hex digits of the SHA-1 of ``store_name``: what tells one store's files from another's."""
    try:
        from _sha1 import sha1  # type: ignore[import-not-found]  # CPython's own: a third of hashlib's import
    except ImportError:  # another interpreter
        from hashlib import sha1
    digest: str = sha1(store_name.encode()).hexdigest()
    return digest[:16]


def cache_path(folder: str, prefix: str, store_name: str, ext: str = ".json") -> str:
    """The cache file ``prefix`` keeps for one store in ``folder`` (``cache/<prefix>-<hash of the store><ext>``)."""
    return os.path.join(folder, "cache", f"{prefix}-{store_hash(store_name)}{ext}")


def seen_paths(folder: str, store_name: str) -> tuple[str, str]:
    """The replay memory's file (identity/replay.Seen), and the JSON file an earlier version kept it in."""
    return cache_path(folder, "seen", store_name, ".marshal"), cache_path(folder, "seen", store_name)
