"""Worktrees bound to leases: lease first, then attach a clean worktree; reuse only what is provably clean;
never lose work.
"""
