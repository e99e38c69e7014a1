"""Writing a file so that readers see the old contents or the new, never a part: a unique temporary file in
the same folder, then ``os.replace``. Standard library only."""

from __future__ import annotations

import json
import os


def atomic_write(path: str, data: bytes, *, mode: int | None = None, tmp_prefix: str | None = None) -> None:
    """Replace ``path`` with ``data`` (and ``mode``, if given) in one rename; the temporary file is removed
    when anything fails. ``tmp_prefix``: how the temporary file's name starts (``tmp_obj_`` in an object
    folder, which git's own prune cleans up after a crash)."""
    prefix = tmp_prefix if tmp_prefix is not None else f".{os.path.basename(path)}.tmp-"
    tmp = os.path.join(os.path.dirname(path) or ".", f"{prefix}{os.getpid()}-{os.urandom(6).hex()}")
    try:
        with open(tmp, "xb") as fh:
            fh.write(data)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(path: str, doc: object, *, pretty: bool = False) -> None:
    """``atomic_write`` of ``doc`` as JSON (``pretty``: indented, sorted keys, a final newline)."""
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n" if pretty else json.dumps(doc)
    atomic_write(path, text.encode("utf-8"))


def cache_path(folder: str, prefix: str, store_name: str) -> str:
    """The cache file ``prefix`` keeps for one store in ``folder`` (``cache/<prefix>-<hash of the store>.json``)."""
    import hashlib

    return os.path.join(folder, "cache", f"{prefix}-{hashlib.sha1(store_name.encode()).hexdigest()[:16]}.json")
