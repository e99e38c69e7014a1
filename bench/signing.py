"""Part 6 of the benchmark (bench/run.py): what signing costs.

1. In-process, per operation: ``SshSigner.sign`` of a real lease record (what acquire and renew add), and
   ``Trust.check_version`` of it (SSHSIG verify + allowed_signers lookup: what every reader adds per version).
   Target (issue 3): under 2 ms each.
2. Start-up: what a configured key adds to a process (importing cryptography's Ed25519 and loading the key),
   and a check that ``import gitlease.cli, gitlease.service.leases`` does not import cryptography at all.
3. ``git lease status`` with 10 leases on a file:// remote, unsigned against signed (trust file read from the
   default branch, every version verified), as whole processes, interleaved round by round.

Runs inside run.py's isolated environment (temporary HOME, venv on PATH). Standard library and gitlease only.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from testing.gitutil import git

TARGET_MS = 2.0


def _median_ms(fn, n: int) -> tuple[float, float]:
    xs = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t) * 1000)
    xs.sort()
    return statistics.median(xs), xs[min(len(xs) - 1, int(len(xs) * 0.9))]


def _proc_ms(argv, cwd, n: int) -> tuple[float, float]:
    def once():
        subprocess.run(argv, cwd=cwd, check=True, capture_output=True)

    for _ in range(2):
        once()
    return _median_ms(once, n)


def run(tmp: Path, quick: bool, log) -> str:
    from gitlease.core import record as records
    from gitlease.identity import sshsig
    from gitlease.identity.signer import SshSigner
    from gitlease.identity.trust import Trust

    tmp = tmp / "signing"
    tmp.mkdir()
    n_inproc, n_proc = (200, 5) if quick else (2000, 20)
    key = sshsig.generate_key(str(tmp / "key"), comment="bench-agent")
    signer = SshSigner(key)
    owner = records.Owner(task_id="bench", agent_id="bench-agent", host="bench-host", pid=4242, key=signer.public_key)
    rec = records.new_record(
        lease_id=records.new_lease_id(time.time()),
        repo="file:///bench.git",
        paths=("libs/tax", "services/billing"),
        workspace_id="wt-bench",
        owner=owner,
        now=time.time(),
        ttl=300,
    )
    data = rec.canonical()
    sig = signer.sign(data)  # first call: warms cryptography's imports
    trust = Trust(
        tuple(sshsig.parse_allowed_signers(f'bench-agent namespaces="gitlease" {signer.public_key}')), "bench"
    )
    assert trust.check_version(rec, data, sig, time.time()).status == "verified"
    sign_ms = _median_ms(lambda: signer.sign(data), n_inproc)
    verify_ms = _median_ms(lambda: trust.check_version(rec, data, sig, time.time()), n_inproc)
    log("  part 6: sign/verify measured")

    py = sys.executable
    light = subprocess.run(
        [
            py,
            "-c",
            "import sys, gitlease.cli, gitlease.service.leases, gitlease.identity.signer, gitlease.identity.trust; "
            "print(int('cryptography' in sys.modules))",
        ],
        capture_output=True,
        text=True,
    )
    light_ok = light.stdout.strip() == "0"
    base_ms = _proc_ms([py, "-c", "import gitlease.cli, gitlease.service.leases"], tmp, n_proc)
    keyed_ms = _proc_ms(
        [
            py,
            "-c",
            f"import gitlease.cli, gitlease.service.leases, gitlease.identity.signer as s; "
            f"s.load_signer({str(tmp / 'key')!r}).sign(b'x')",
        ],
        tmp,
        n_proc,
    )

    # whole `git lease status` processes: 10 leases, unsigned and signed stores, measured round by round
    works = {}
    for mode in ("unsigned", "signed"):
        bare = tmp / f"{mode}.git"
        work = tmp / f"{mode}-work"
        git(tmp, "init", "-q", "--bare", str(bare))
        git(tmp, "init", "-q", str(work))
        if mode == "signed":
            (work / ".gitlease").mkdir()
            (work / ".gitlease" / "allowed_signers").write_text(
                f'bench-agent namespaces="gitlease" {signer.public_key}\n'
            )
            git(work, "add", ".gitlease")
            git(work, "config", "lease.signingKey", str(tmp / "key"))
        git(work, "commit", "-q", "--allow-empty", "-m", "init")
        git(work, "push", "-q", bare.as_uri(), "HEAD:refs/heads/main")
        git(work, "config", "lease.remote", bare.as_uri())
        for i in range(10):
            git(work, "lease", "acquire", "--scope", f"s/{i}")
        works[mode] = work
    samples: dict[str, list[float]] = {mode: [] for mode in works}
    for round_ in range(n_proc + 2):  # interleaved, so that load drift hits both alike; 2 warm-up rounds
        for mode, work in works.items():
            t = time.perf_counter()
            subprocess.run(["git", "lease", "status"], cwd=work, check=True, capture_output=True)
            if round_ >= 2:
                samples[mode].append((time.perf_counter() - t) * 1000)
    status = {
        mode: (statistics.median(xs), sorted(xs)[min(len(xs) - 1, int(len(xs) * 0.9))]) for mode, xs in samples.items()
    }
    log("  part 6: start-up and status measured")

    def verdict(name, x):
        return f"- {name} under {TARGET_MS:g} ms: **{'met' if x < TARGET_MS else 'not met'}** ({x:.3f} ms)."

    L = [
        "## 6. Signing (SSHSIG, Ed25519)",
        "",
        f"In-process, median and p90 over {n_inproc} calls, for one real lease record ({len(data)} bytes):",
        "",
        "| operation | median ms | p90 ms |",
        "| --- | ---: | ---: |",
        f"| sign (`SshSigner.sign`: what acquire and renew add per version) | {sign_ms[0]:.3f} | {sign_ms[1]:.3f} |",
        f"| verify (`Trust.check_version`: SSHSIG verify + allowed_signers lookup, per version read) | "
        f"{verify_ms[0]:.3f} | {verify_ms[1]:.3f} |",
        "",
        verdict("Sign", sign_ms[0]),
        verdict("Verify", verify_ms[0]),
        "",
        f"Start-up, whole processes, median and p90 over {n_proc} runs:",
        "",
        "| process | median ms | p90 ms |",
        "| --- | ---: | ---: |",
        f'| `python -c "import gitlease.cli, gitlease.service.leases"` | {base_ms[0]:.1f} | {base_ms[1]:.1f} |',
        f"| the same + load the key and sign once (cryptography imported) | {keyed_ms[0]:.1f} | {keyed_ms[1]:.1f} |",
        f"| `git lease status`, 10 leases, unsigned store (file://) | {status['unsigned'][0]:.1f} | "
        f"{status['unsigned'][1]:.1f} |",
        f"| `git lease status`, 10 leases, signed store (trust read from `main`, 10 versions verified) | "
        f"{status['signed'][0]:.1f} | {status['signed'][1]:.1f} |",
        "",
        f"A configured key adds **{keyed_ms[0] - base_ms[0]:.1f} ms** to a process (importing cryptography's "
        f"Ed25519 and reading the key); without a key nothing is added: `import gitlease.cli, gitlease.service.leases, "
        f"gitlease.identity.signer, gitlease.identity.trust` {'does not import' if light_ok else '**imports**'} cryptography.",
        "",
    ]
    return "\n".join(L) + "\n"
