"""Keeping a lease alive while its holder works, and stopping the work when it is lost: heartbeats, hold(),
git lease run's supervisor and watchdog, the per-host renewal agent, batch renewals, waiting for a scope.
"""
