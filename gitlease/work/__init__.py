"""The queue runner, ``git lease work``: a queue of tasks to landed commits (docs/work.md).

``queue.py`` reads the queue; ``runner.py`` runs it (``run_queue``, the stable entry); the outcomes it records
on the store are gitlease.service.outcomes.

The package itself is callable, so that ``gitlease.work(...)`` is the Python API::

    summary = gitlease.work("queue.jsonl", workers=4, command=["./agent.sh"], verify="make test", land="main")
"""

from __future__ import annotations

import sys
import types


def work(queue, *, command, repo: str = ".", workers: int = 1, verify=None, land=None, **options):
    """Run ``queue`` to the end in the clone at ``repo`` and return the Summary (``summary.done``,
    ``.failed``, ``.makespan``, ``.speedup``, ``.to_json()``). ``queue``: a JSON-lines file, an iterable of
    task dicts, a callback returning the tasks queued now, or a TaskSource. ``command``: argv (a string is run
    by the shell). Other options: gitlease.work.runner.run_queue."""
    from gitlease.work.runner import run_queue

    argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
    return run_queue(repo, queue, command=argv, workers=workers, verify=verify, land=land, **options)


class _Callable(types.ModuleType):
    def __call__(self, queue, **kwargs):
        return work(queue, **kwargs)


sys.modules[__name__].__class__ = _Callable

__all__ = ["work"]
