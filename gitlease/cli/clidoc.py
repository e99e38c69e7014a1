"""What docs/cli.md says beyond the typer definitions: each command's output lines and exit codes, the exit-code
table, the configuration table. ``python -m gitlease.cli.manpage`` writes docs/cli.md from the commands
(synopsis, description, options: ``gitlease.cli.COMMANDS`` and the typer apps) and from this table (output,
exit codes); tests/test_manpage.py fails when the file is stale, when a command has no entry here, and when an
output line documented here is not in the code any more (its text before the first ``<...>`` must be).

Stdlib only, no logic: data read by the generator and the tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Doc:
    """``lines``: what the command prints, one pattern per line (``<...>`` marks what varies); ``exits``: its
    own exit codes and when (1 and 2, errors and usage, apply to every command and are not repeated);
    ``note``: one sentence more, where the options do not say it."""

    lines: tuple[str, ...] = ()
    exits: dict[int, str] = field(default_factory=dict)
    note: str = ""


HELD = "another lease overlaps (the message names its id, task, agent and time left)"
LOST = "the lease was lost or replaced: stop writing"
VIOLATION = "a path outside the change's leases or inside another's (each path and its holder named)"

DOCS: dict[str, Doc] = {
    "acquire": Doc(
        (
            "lease acquired: <lease>",
            "workspace: <id>",
            "ttl: <seconds>s",
            "store: <remote>",
            "cleared expired lease: <lease>",
            "git-lease: warning: <scope path> matches no path in HEAD or the work tree (a typo?); "
            "it is leased all the same",
            "git-lease: waiting (<s>s): <why>",
        ),
        {0: "granted", 3: HELD + "; with --wait, also when the wait ran out", 5: "the store would not trust the lease"},
        "A scope too large for one record (over 1,024 paths or 64 KiB) or a path git cannot store as a ref is "
        "refused before any push (exit 2).",
    ),
    "renew": Doc(("lease renewed: version=<n> expiresAt=<time>",), {0: "renewed", 6: LOST}),
    "progress": Doc(
        ("progress: <note> (sent with the next renewal of <lease>)",),
        {0: "recorded", 6: LOST + " (or its stop deadline passed)"},
        "Inside git lease run the note goes with the next renewal; elsewhere it is a renewal carrying the note.",
    ),
    "release": Doc(
        (
            "lease released: <lease>",
            "already released: <lease> (<who and when>)",
            "audited: <reason> in <audit ref>",
            "no leases held by this worktree",
        ),
        {
            0: "released, or already gone",
            1: "a lease this worktree does not hold (the message says where it is)",
            6: LOST,
        },
        "--force (a gitlease-admin key; anyone on an unsigned store) releases a lease held elsewhere, live or "
        "invalid, with its audit entry in the same push.",
    ),
    "extend": Doc(
        ("lease <extended>: <lease> +<path>", "scope: <paths>", "version: <n> expiresAt=<time>"),
        {0: "extended", 3: HELD, 6: LOST},
    ),
    "narrow": Doc(
        ("lease <narrowed>: <lease> -<path>", "scope: <paths>", "version: <n> expiresAt=<time>"),
        {0: "narrowed", 6: LOST},
    ),
    "status": Doc(
        (
            "signed: trust from <trust files> on <branch> (<commit>) of <store>",
            "unsigned: <why>",
            "<lease>  <scope>  task=<task> agent=<agent>  <active 120s left>  v<n>  [held here]",
            "warning: store unreachable (<why>); showing state fetched <n>s ago (<time>)",
            "foreign ref (not a lease; it blocks nothing): <ref>",
        ),
        {
            0: "listed, also from the last fetched state when the store is unreachable (--fresh: exit 1 then)",
            5: "two live leases overlap: a store fault, both named",
        },
        "An invalid lease is listed INVALID with its reason: its scope stays blocked until an admin clears it.",
    ),
    "show": Doc(
        (
            "lease <lease>: <state> (<verification>, signed by <fingerprint>)",
            "history:",
            "  v<n>  <commit>  <time>  <who>",
        ),
        {0: "shown", 1: "the lease is gone (the audit log says how) or unknown", 5: "the lease does not verify"},
    ),
    "can-start": Doc(("free: <paths>",), {0: "free now", 3: HELD}),
    "init": Doc(
        (
            "remote: <status>: lease.remote = <remote>",
            "key: <status>: lease.signingKey = <path> (<fingerprint>)",
            "signing: <status>: git commit signs with lease.signingKey (gpg.format=ssh, user.signingKey, "
            "commit.gpgSign in <where>)",
            "trust: <status>: <added> <.gitlease/signers/host.pub> on <branch> of <remote> (commit <id>): "
            "readers trust <agents> now",
            "hooks: <status>: <pre-commit installed; pre-push installed>",
            "--yes answered yes: <question>",
            "nothing to change",
        ),
        {0: "done; a step only the user can do is a todo line, not an error"},
        "One line per step: remote, agent or agents, key, signing, trust, hooks, ci; each set, unchanged, "
        "skipped or todo. Questions are asked on a terminal, answered by --yes, skipped otherwise.",
    ),
    "doctor": Doc(
        ("gitlease doctor: <store>", "<pass|fail|warn|skip>  <check>  <message>", "ok: <store> can host leases"),
        {0: "every check passed or warned", 1: "a check failed: the remote cannot safely host leases"},
    ),
    "budget": Doc(("<pushes per minute against the host's limit, and the largest fleet that fits>",), {0: "computed"}),
    "completion": Doc(("<the completion script>",), {0: "printed"}),
    "agent": Doc(
        ("agent running: pid <pid>, <n> leases, socket <path>", "agent stopped after <n>s idle"),
        {0: "stopped after idling, or (--ping) one answers", 1: "--ping: none answers; or one already runs"},
    ),
    "sweep-stale": Doc(
        (
            "reclaimed: <lease> owner=<task> <rule>",
            "would reclaim: <lease> owner=<task> <rule>",
            "skipped: <lease> owner=<task> <rule>: renewed since it was read, it stays",
        ),
        {0: "swept", 1: "a reclaim failed", 5: "this key may not write the reclaims (an admin key is needed)"},
    ),
    "sweep": Doc(("<as sweep-stale>",), {0: "swept", 1: "a reclaim failed"}, "An alias of sweep-stale."),
    "log": Doc(
        ("<time>  <event>  <lease>  v<n>  by=<writer>  <details>", "no events"),
        {0: "listed (an entry that does not verify is shown INVALID)"},
    ),
    "ci install": Doc(
        ("wrote: <path>", "up to date: <path>", "next: <what only you can do>"),
        {
            0: "written",
            1: "a different file is there (--overwrite)",
            2: "where the jobs install gitlease from is unknown",
        },
        "The jobs install this gitlease pinned to its commit (git+URL@COMMIT), or --install SPEC.",
    ),
    "install-hooks": Doc(("<hook>: <installed|updated|unchanged> <path>",), {0: "installed"}),
    "uninstall-hooks": Doc(("<hook>: <removed|restored|absent> <path>",), {0: "removed"}),
    "agent-hooks install": Doc(
        ("<agent>: <installed|updated|unchanged> <path>", "note: <how to switch them on>"), {0: "done"}
    ),
    "agent-hooks status": Doc(
        ("<agent>: <active|NOT ACTIVE> (<where>)", "  <why not>"),
        {0: "every agent asked about runs with the hooks", 1: "one would run unfenced (named, with why)"},
    ),
    "agent-hooks uninstall": Doc(("<agent>: <removed|absent> <path>",), {0: "done"}),
    "mcp": Doc(
        ("<the Model Context Protocol on stdout; its own errors on stderr>",),
        {0: "the client hung up"},
        "A tool error carries kind, exitCode and, for a busy scope, holders.",
    ),
    "verify": Doc(
        (
            "verify ok: <n paths in n commits> (<base>..<head>), lease <lease> (from <trailer|branch|flag>)",
            "gitlease: verify refused (<why>): <n paths outside> the change's leases",
            "gitlease: <commit id is> not SSH-signed, so a Lease: claim in it does not count on this signed store: "
            "<how to sign it>",
        ),
        {0: "every path may be written by this change", 1: "the store cannot be read (fail closed)", 4: VIOLATION},
        "Which lease: --lease, else the commits' Lease: trailers (on a signed store only in commits SSH-signed by "
        "the lease's key), else a lease id in the branch's name ($GITHUB_HEAD_REF, "
        "$CI_MERGE_REQUEST_SOURCE_BRANCH_NAME); none: checked against others' leases only.",
    ),
    "server-hook": Doc(
        ("<remote: gitlease: push refused (server)>: <n paths> inside leases held by others",),
        {0: "accepted", 4: "a lease ref that is not a proper next version, or a branch touching others' leases"},
    ),
    "worktree add": Doc(
        ("worktree attached: <path>", "workspace: <id>", "lease: <lease>", "branch: <branch> (from <base> <commit>)"),
        {0: "attached"},
    ),
    "worktree list": Doc(
        ("<id>  <state>  lease=<lease> (<lease state>)  <clean|dirty|busy>  age=<n>s  <path>", "no linked worktrees"),
        {0: "listed"},
    ),
    "worktree prune": Doc(("<pooled|removed|quarantined>: <id> (<why>)", "nothing to prune"), {0: "done"}),
    "worktree remove": Doc(
        ("worktree removed: <id> (<path>)", "saved: <ref>", "lease still held, now by this worktree: <lease>"),
        {0: "removed", 1: "uncommitted work (--save) or a live process in it"},
    ),
    "keygen": Doc(("key written: <path> (public key: <path>.pub)", "fingerprint: <fingerprint>"), {0: "written"}),
    "trust add": Doc(
        (
            "signer <name>: added to <branch> of <remote> (<file>, commit <id>, <n> pushes)",
            "signer <name>: unchanged on <branch> of <remote> (<file>): already trusted",
            "signer <name>: written to <the work tree> (<file>)",
            "trusts: <agents> with key <fingerprint>",
        ),
        {0: "trusted (or already)", 1: "the branch refused the push (protected?): --no-push, then review"},
    ),
    "trust remove": Doc(
        ("signer <name>: removed from <branch> of <remote> (<file>, commit <id>, <n> pushes)",),
        {0: "revoked", 2: "no such signer file"},
        "The leases its keys signed stop verifying; their scopes stay blocked until an admin clears them.",
    ),
    "trust list": Doc(
        (
            "signed: trust from <trust files> on <branch> (<commit>) of <store>",
            "<file>: <agents>  <fingerprint>  (<namespaces>)",
        ),
        {0: "listed", 5: "a trust file does not parse (named)"},
    ),
    "run": Doc(
        (
            "git-lease: lease acquired: <lease> (<paths>, ttl <n>s)",
            "git-lease: lease released: <lease>",
            "git-lease: waiting: <why>; next try in <s>s",
        ),
        {
            0: "the command's own code (128+N after signal N, 127 when it cannot start)",
            3: HELD,
            6: LOST + ": the command was stopped",
        },
        "Its own lines go to stderr; the command's output is left alone.",
    ),
    "push": Doc(
        ("lease renewed: version=<n> expiresAt=<time>",),
        {
            0: "the branches and the renewal landed together",
            1: "the branch was refused for its own reasons (push rejected, nothing landed)",
            4: VIOLATION,
            6: LOST + ": nothing landed",
        },
    ),
    "plan": Doc(
        (
            "start: <task>  <scope>",
            "blocked: <task>  <scope>  by <lease or task>",
            "oversized: <task>  <n> paths: <why>; leasing the coarser <m>-path scope instead",
            "oversized: <task>  <n> paths: <why>; a scope that fits: <scope>",
            "could start now by granularity: <counts>",
            "lease acquired: <lease> for <task>",
            "refused: <task>: <why>",
        ),
        {0: "planned (read acquired with --acquire)"},
    ),
    "work": Doc(
        (
            "worker <n>: <claimed> <task>: <lease=… scope=… attempt=n>",
            "worker <n>: <landed> <task>: <commit=… branch=…>",
            "worker <n>: <failed> <task>: <why>",
            "done <n>, failed <n>; makespan <s>s; agents <s>s, verify <s>s, <landing Ns>; parallelism <x> "
            "(work / makespan, <n> workers)",
        ),
        {
            0: "every task done",
            1: "some tasks failed (named)",
            130: "interrupted: running tasks wound down, leases released",
        },
        "--status QUEUE prints each task's state from the store (done, failed, retrying, running, waiting, pending).",
    ),
}

EXIT_TABLE: tuple[tuple[int, str, str], ...] = (
    (0, "ok", "done; also release of a lease already gone, status from the last fetched state"),
    (1, "error", "the store unreachable or a write's outcome unknown (re-read, nothing assumed); bad configuration; "
     "a lease this worktree does not hold; a check that failed"),
    (2, "usage", "an unknown option, a bad value, an invalid scope or lease id, options that do not go together, "
     "lease.remote unset in a repository with remotes (every command that reads or writes the store)"),
    (3, "held by another lease", "acquire, can-start, run, extend"),
    (4, "scope violation", "hooks, verify, server-hook, push"),
    (5, "invalid record or signature, or an untrusted writer", "a lease that does not verify; a trust file missing "
     "while lease.signingKey is set, or unparsable; a writer the trust would not trust"),
    (6, "lease lost or replaced: stop writing", "renew, push, extend, narrow, progress, run, release"),
    (130, "interrupted", "Ctrl-C"),
)  # fmt: skip

# git config, environment, flag, default: lowest to highest, git config first
CONFIG: tuple[tuple[str, str, str, str], ...] = (
    ("lease.remote", "", "--remote", "none: this repository's own refs where it has no remotes; where it has, "
     "commands refuse (exit 2) until it is set: a remote, or local on purpose"),
    ("lease.ttl", "", "--ttl", "300"),
    ("lease.agent", "GITLEASE_AGENT", "--agent", "<user>@<host> (the host alone for a uid with no name)"),
    ("lease.task", "GITLEASE_TASK", "--task", "manual"),
    ("lease.skew", "", "", "30 (seconds an expired lease still blocks)"),
    ("lease.timeout", "", "", "30 (seconds any git network call may take)"),
    ("lease.repo", "", "", "the remote URL without credentials"),
    ("lease.workspace", "", "--workspace", "the worktree folder's name"),
    ("lease.sweep.expired", "", "", "true (sweep rule: expired beyond lease.skew)"),
    ("lease.sweep.missedHeartbeats", "", "", "true (sweep rule: renewEvery declared, two intervals missed)"),
    ("lease.sweep.deadHolder", "", "", "true (sweep rule: the holder's process on this host is gone)"),
    ("lease.progressTimeout", "", "", "unset: off; run and hold() stop a command silent for this long"),
    ("lease.enforce", "", "", "strict in a worktree that holds a lease, others elsewhere; or warn, off"),
    ("lease.worktreeRoot", "", "", "<parent>/<repo>.worktrees"),
    ("lease.worktree.disposable", "", "", "__pycache__ *.pyc *.pyo .pytest_cache .mypy_cache .ruff_cache "
     ".hypothesis node_modules/.cache"),
    ("lease.renewAgent", "GITLEASE_RENEW_AGENT", "run --renew-agent/--no-renew-agent", "true"),
    ("", "GITLEASE_AGENT_SOCKET", "agent --socket", "$XDG_RUNTIME_DIR/gitlease/agent.sock"),
    ("lease.signingKey", "", "", "none: unsigned. An Ed25519 private key file, or a public key whose private half "
     "is in ssh-agent; git lease init also makes git commit sign with it"),
    ("lease.allowedSignersFile", "", "", ".gitlease/allowed_signers on the store's default branch, read with the "
     "signer files beside it (.gitlease/signers/*.pub); an absolute path: a local file"),
)  # fmt: skip
