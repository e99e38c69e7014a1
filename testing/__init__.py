"""Shared test support for the tests, the soak and the benchmarks: real git servers on loopback (servers),
the one git helper (gitutil), and agents sharing one lease store (fleet). Not installed with gitlease."""
