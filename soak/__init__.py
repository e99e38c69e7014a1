"""The reliability harness (issue 9): workers, a fault injector and an independent checker. Not installed
with gitlease; run it with ``make soak`` (``python -m soak.run``)."""
