"""Python's cycle collector held off while a reader builds many small objects that form no cycles (a view,
a record and a JSON entry for each of 10,000 leases): each collection of the youngest generation walks what
was just made, and the oldest one walks everything made so far, again and again as the count grows (about
15% of a ``status`` at 10,000 leases). Reference counting frees them as before; the collector runs again after.

Process-wide (``gc.disable``), so threads overlap safely: each pause turns the collector back on only when it
turned it off, and a collector someone else turned off stays off.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
