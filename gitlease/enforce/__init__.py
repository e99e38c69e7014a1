"""Enforcement: the rule that decides which changed paths a writer may commit or push (rules), and every
place it runs: the git hooks (entry, install), git lease verify in CI (verify), the server's pre-receive
hook (server). rules and entry are standard library only: git runs them on every commit.
"""
