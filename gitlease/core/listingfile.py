"""The last listing of each store, kept in a file in the common git dir (``<shared>/cache/<hash>.marshal``):
what a read answers from, marked stale, when the store cannot be reached (service/base._RefsCache), and what
the hooks consult without a network round trip (enforce/rules.load_refs_cache). Written by every full read of
the store, so ``marshal``-ed (20,000 refs in about 2 ms, where JSON took 10). Each entry is checked where it
is read: a damaged file is no listing, never a crash. Standard library only (the hooks import it).
"""

from __future__ import annotations

import marshal
import os

TAG = "gitlease-refs-1"


def path_in(folder: str, store_name: str) -> str:
    """The file of ``store_name`` under ``folder`` (the repository's shared gitlease dir)."""
    from gitlease.core.cachenames import store_hash

    return os.path.join(folder, "cache", store_hash(store_name) + ".marshal")


def write(path: str, refs: dict[str, str], fetched_at: float) -> None:
    """Keep ``refs`` as listed at ``fetched_at`` (raises OSError when it cannot be written)."""
    from gitlease.core.fsutil import atomic_write

    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(path, marshal.dumps((TAG, float(fetched_at), refs)))


def read(path: str) -> tuple[dict[str, str], float] | None:
    """(refs, fetched at) as kept, or None: no file, or one that is not such a listing."""
    try:
        with open(path, "rb") as fh:
            doc = marshal.loads(fh.read())
    except (OSError, ValueError, EOFError, TypeError):
        return None
    if type(doc) is not tuple or len(doc) != 3 or doc[0] != TAG or type(doc[1]) is not float:
        return None
    refs = doc[2]
    if type(refs) is not dict or not all(type(k) is str and type(v) is str for k, v in refs.items()):
        return None
    return refs, doc[1]
