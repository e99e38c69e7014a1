"""The pure lease model (scope algebra, records, ref names, the clock, errors) and the plumbing that speaks
git (the one git runner, loose objects, the store, repository and configuration, this worktree's state).

Standard library only, and nothing here imports another gitlease package: every other layer stands on this one.
Modules are imported one by one (this file imports nothing), so the hooks pay only for what they use.
"""
