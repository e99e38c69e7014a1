"""The suite under load: ``make test`` N times while CPU hogs run, and every failure by name.

    python testing/stress.py [--rounds 10] [--hogs 8] [--suites 1] [--jobs 4] [--write docs/reliability.md]
    make test-stress ROUNDS=10 HOGS=8

Each round runs the default suite (``pytest -q -n JOBS``, what ``make test`` runs; ``--suites 2`` runs two at
once, as two people running ``make test`` together) while ``--hogs`` busy-looping processes keep the cores
busy; the 1-minute load average is sampled every few seconds. A round's failures are read from its JUnit XML
report, so they are named (test id and the first line of the error), never only counted. Exit 0 when no round
failed. ``--write`` puts the summary in docs/reliability.md between ``<!-- stress:begin -->`` and
``<!-- stress:end -->``. Standard library only; stops the hogs it started (by their pids) however it ends.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from testing.benchdoc import markers, write_section  # noqa: E402

BEGIN, END = markers("stress")
HOG = "import signal, sys\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nwhile True:\n    pass\n"


class LoadSampler(threading.Thread):
    """The 1-minute load average every ``every`` seconds, until stopped."""

    def __init__(self, every: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.every, self.samples = every, []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.samples.append(os.getloadavg()[0])
            self.done.wait(self.every)

    def stop(self) -> tuple[float, float]:
        self.done.set()
        self.join()
        return (min(self.samples), max(self.samples)) if self.samples else (0.0, 0.0)


def failures(report: Path) -> tuple[int, list[str]]:
    """(tests run, "test id: first line of the error" for each failed or errored test) from a JUnit XML file."""
    if not report.exists():
        return 0, [f"(no report: {report.name})"]
    root = ET.parse(report).getroot()
    ran, out = 0, []
    for case in root.iter("testcase"):
        ran += 1
        for bad in list(case.findall("failure")) + list(case.findall("error")):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            first = (bad.get("message") or (bad.text or "").strip() or "?").splitlines()[0][:160]
            out.append(f"{name}: {first}")
    return ran, out


def one_round(k: int, args: argparse.Namespace, tmp: Path) -> dict:
    """One round: ``--suites`` suites at once, under the hogs already running."""
    sampler = LoadSampler()
    sampler.start()
    started = time.monotonic()
    procs = []
    for s in range(args.suites):
        report = tmp / f"round{k}-suite{s}.xml"
        argv = [sys.executable, "-m", "pytest", "-q", "-n", str(args.jobs), "-p", "no:cacheprovider"]
        argv += [f"--junitxml={report}", *args.pytest_args]
        log = open(tmp / f"round{k}-suite{s}.log", "wb")
        procs.append((subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT), report, log))
    codes = []
    for proc, _report, log in procs:
        codes.append(proc.wait())
        log.close()
    low, high = sampler.stop()
    ran, failed = 0, []
    for _proc, report, _log in procs:
        n, f = failures(report)
        ran += n
        failed += f
    return {
        "round": k + 1,
        "seconds": round(time.monotonic() - started),
        "load": (round(low, 1), round(high, 1)),
        "tests": ran,
        "exit": codes,
        "failures": failed,
    }


def start_hogs(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n)]


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for h in hogs:
        if h.poll() is None:
            h.terminate()
    for h in hogs:
        try:
            h.wait(timeout=10)
        except subprocess.TimeoutExpired:
            h.kill()
            h.wait()


def summary(rounds: list[dict], args: argparse.Namespace, when: str) -> list[str]:
    failed = sum(len(r["failures"]) for r in rounds)
    lows = [r["load"][0] for r in rounds] or [0.0]
    highs = [r["load"][1] for r in rounds] or [0.0]
    lines = [
        f"`testing/stress.py --rounds {args.rounds} --hogs {args.hogs} --suites {args.suites} --jobs {args.jobs}` "
        f"(`make test-stress`), {when}, {os.cpu_count()} CPUs: {len(rounds)} rounds, **{failed} failures**, "
        f"1-minute load {min(lows):.1f} to {max(highs):.1f}.",
        "",
        "| round | tests | minutes | load (1-min, min to max) | failures |",
        "| ---: | ---: | ---: | --- | --- |",
    ]
    for r in rounds:
        names = "; ".join(r["failures"]) or "none"
        lines.append(
            f"| {r['round']} | {r['tests']} | {r['seconds'] / 60:.1f} | {r['load'][0]:.1f} to {r['load'][1]:.1f} | "
            f"{names} |"
        )
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--hogs", type=int, default=8, help="busy-looping processes during the rounds")
    ap.add_argument("--suites", type=int, default=1, help="suites run at once in each round")
    ap.add_argument("--jobs", type=int, default=4, help="pytest-xdist processes per suite (make test's JOBS)")
    ap.add_argument("--write", metavar="FILE", help="write the summary into FILE (docs/reliability.md)")
    ap.add_argument("pytest_args", nargs="*", help="passed to pytest (after --), e.g. a test file")
    args = ap.parse_args(argv)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    rounds: list[dict] = []
    hogs = start_hogs(args.hogs)
    try:
        with tempfile.TemporaryDirectory(prefix="gitlease-stress-") as tmp:
            for k in range(args.rounds):
                r = one_round(k, args, Path(tmp))
                rounds.append(r)
                status = "; ".join(r["failures"]) or "no failure"
                print(
                    f"round {r['round']}/{args.rounds}: {r['tests']} tests in {r['seconds']} s, load "
                    f"{r['load'][0]:.1f}-{r['load'][1]:.1f}: {status}",
                    flush=True,
                )
    finally:
        stop_hogs(hogs)
    lines = summary(rounds, args, when)
    print("\n".join(lines))
    if args.write:
        body = "\n".join([BEGIN, "## The suite under load (`make test-stress`)", "", *lines, END])
        write_section(Path(args.write), body, BEGIN, END, title="# Reliability")
    return 1 if any(r["failures"] or any(r["exit"]) for r in rounds) else 0


if __name__ == "__main__":
    sys.exit(main())
