"""Operating a store: the stale-lease sweeper, the remote's fitness check (doctor), the push budget of a
fleet, the guided set-up (init) and the CI jobs it installs (templates).
"""
