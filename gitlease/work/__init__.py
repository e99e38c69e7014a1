"""The queue runner, ``git lease work``: a queue of tasks to landed commits (docs/work.md).

``queue.py`` reads the queue; ``runner.py`` runs it (``run_queue``, the stable entry); the outcomes it records
on the store are gitlease.service.outcomes."""
