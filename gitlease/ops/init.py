"""``git lease init``: one idempotent step from a plain repository to agents working under leases.

Steps, each reported as a ``Step(name, status, detail)`` with status ``set`` | ``unchanged`` | ``skipped`` |
``todo`` (something only the user can do, such as committing the trust-file line through review):

1. config: ``lease.remote`` (``--remote`` / ``--lease-repo``), ``lease.agent``;
2. key: ``lease.signingKey`` (an existing key, ``--key PATH``, or a new Ed25519 key for the agent);
3. signing: ``git commit`` signs with that key (``gpg.format=ssh``, ``user.signingKey``, ``commit.gpgSign``, in
   this clone's config, or this worktree's with ``extensions.worktreeConfig``): on a signed store a commit's
   ``Lease:`` claim counts only when the lease's owner key signed it (the CI check, the server hook);
4. trust: the key's line in this host's signer file, ``.gitlease/signers/<host>.pub`` (``--signer NAME``),
   published to the store's default branch on a yes (``gitlease.ops.trust``: a commit of its own, pushed with
   retries, so hosts set up at the same time never conflict); unchanged when the store already trusts it;

``agents`` (``--agents worker-1..5``, ``a,b,c`` or a pattern ``worker-*``) sets up a fleet on this host instead of
one agent: one key for the host, and ONE trust-file line whose principals are those agents (a list, or the
pattern), so the whole fleet is trusted by one commit of the trust file; each agent process then says which
one it is (``--agent worker-3`` or ``GITLEASE_AGENT=worker-3``). Agents of one host and user share a key
because they share a trust domain: each could read the others' key files anyway (docs/protocol.md).
5. hooks: ``pre-commit`` and ``pre-push`` installed (chained with what is there);
6. ci: the scheduled sweep job and the verify check (``--ci github|gitlab``), else the command that installs them.

Running it again changes nothing (every step ``unchanged``). Questions are decided by ``decide(question)``:
the CLI asks on a terminal, answers yes with ``--yes``, and skips otherwise.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from gitlease.core import gitq
from gitlease.core.config import Settings
from gitlease.core.errors import ConfigError, GitLeaseError, UsageError
from gitlease.core.repo import Repo


@dataclass(frozen=True)
class Step:
    name: str
    status: str  # set | unchanged | skipped | todo
    detail: str

    def line(self) -> str:
        return f"{self.name}: {self.status}: {self.detail}"

    def to_json(self) -> dict:
        return {"name": self.name, "status": self.status, "detail": self.detail}


def _config(repo: Repo, key: str) -> str | None:
    return repo.config.get(key.lower())


def _set(repo: Repo, key: str, value: str) -> None:
    gitq.config_set(repo.cwd, key, value)


def init(
    path: str = ".",
    *,
    remote: str | None = None,
    lease_repo: str | None = None,
    agent: str | None = None,
    key: str | None = None,
    sign: bool | None = None,
    hooks: bool = True,
    ci: str | None = None,
    agents: str | None = None,
    signer: str | None = None,
    decide: Callable[[str], bool] = lambda q: False,
) -> list[Step]:
    if remote and lease_repo:
        raise UsageError("give --remote or --lease-repo, not both (--lease-repo is a remote of its own)")
    if agents is not None and agent is not None:
        raise UsageError("give --agent (one agent) or --agents (a fleet on this host), not both")
    names = expand_agents(agents) if agents is not None else None
    repo = Repo.discover(path)
    steps: list[Step] = []
    steps += _store(repo, remote or lease_repo, dedicated=bool(lease_repo))
    repo = Repo.discover(path)  # re-read the config we wrote
    if signer is not None:
        from gitlease.ops.trust import check_name

        check_name(signer)
    if names is not None:
        who = ",".join(names)
        key_name = "fleet_" + _common_stem(names)
        patterns = [n for n in names if any(c in n for c in "*?")]
        which = f"{len(names)} agents ({', '.join(names)})" if not patterns else f"every agent matching {who}"
        steps.append(
            Step(
                "agents",
                "todo",
                f"{which} share this host's key; each agent process runs with --agent NAME (or GITLEASE_AGENT=NAME)",
            )
        )
    else:
        who, step = _agent(repo, agent)
        key_name = who
        steps.append(step)
    shared = bool(_config(repo, "lease.remote"))
    # one machine, local store: unsigned is fine; a fleet set up with --agents is signed unless --no-sign
    want_sign = sign if sign is not None else (shared or names is not None)
    key_step, public = _key(repo, key_name, key, want_sign, decide)
    steps.append(key_step)
    repo = Repo.discover(path)  # the key's config, as written
    steps.append(_signing(repo) if public else Step("signing", "skipped", "unsigned: no key"))
    if public:
        steps.append(_trust(repo, names or [who], public, signer, decide))
    else:
        steps.append(Step("trust", "skipped", "unsigned: no key"))
    steps.append(_hooks(repo) if hooks else Step("hooks", "skipped", "--no-hooks"))
    steps.append(_ci(repo, ci))
    return steps


_NAME = re.compile(r"^[A-Za-z0-9._@+=:/-]{1,200}$")
_PATTERN = re.compile(r"^[A-Za-z0-9._@+=:/*?-]{1,200}$")


def expand_agents(spec: str) -> list[str]:
    """``worker-1..5`` -> worker-1 ... worker-5; ``a,b,c`` -> a, b, c; ``worker-*`` stays a pattern (OpenSSH
    allowed_signers principals: ``*`` and ``?``), trusting every agent id it matches, now and later."""
    out: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        m = re.fullmatch(r"(.*?)(\d+)\.\.(\d+)", part)
        if m:
            stem, lo, hi = m.group(1), int(m.group(2)), int(m.group(3))
            if hi < lo or hi - lo >= 1000:
                raise UsageError(f"--agents {part!r}: a range runs up, at most 1000 agents (worker-1..5)")
            width = len(m.group(2)) if m.group(2).startswith("0") else 0
            out += [f"{stem}{str(n).zfill(width)}" for n in range(lo, hi + 1)]
        elif part:
            out.append(part)
    if not out:
        raise UsageError("--agents needs agent ids: worker-1..5, a,b,c, or a pattern such as 'worker-*'")
    for name in out:
        if not (_NAME.match(name) or _PATTERN.match(name)) or name.startswith(("-", "!")):
            raise UsageError(
                f"agent id {name!r} cannot be an allowed_signers principal: use letters, digits and "
                ". _ @ + = : / - (and * ? in a pattern) only"
            )
    return list(dict.fromkeys(out))


def _common_stem(names: list[str]) -> str:
    """A name for the fleet's key file: what the agent ids have in common (``worker`` for worker-1..5)."""
    stem = os.path.commonprefix(names).rstrip("-_.*?0123456789") or "agents"
    return re.sub(r"[^A-Za-z0-9._-]", "_", stem)


def _store(repo: Repo, remote: str | None, *, dedicated: bool) -> list[Step]:
    current = _config(repo, "lease.remote")
    if remote is None:
        if current:
            return [Step("remote", "unchanged", f"lease.remote = {current}")]
        return [
            Step(
                "remote",
                "unchanged",
                "no lease.remote: this repository's own refs (one machine); "
                "--remote origin shares leases through a remote",
            )
        ]
    if current == remote:
        return [Step("remote", "unchanged", f"lease.remote = {remote}")]
    if not dedicated and "://" not in remote and not remote.startswith(("/", ".")) and ":" not in remote:
        known = gitq.remote_names(repo.cwd)
        if remote not in known:
            raise UsageError(
                f"no git remote named {remote!r} (known: {', '.join(known) or 'none'}); give a remote name or a URL"
            )
    _set(repo, "lease.remote", remote)
    what = "a dedicated lease repository" if dedicated else "the code's remote"
    return [Step("remote", "set", f"lease.remote = {remote} ({what})")]


def _agent(repo: Repo, agent: str | None) -> tuple[str, Step]:
    from gitlease.core.config import resolve

    current = _config(repo, "lease.agent")
    if agent is None and current:
        return current, Step("agent", "unchanged", f"lease.agent = {current}")
    who = agent or resolve(repo.config).agent
    if not re.match(r"^[A-Za-z0-9._@+=:/-]{1,200}$", who):
        raise UsageError(
            f"agent id {who!r} cannot be an allowed_signers principal: use letters, digits and "
            ". _ @ + = : / - only (--agent ID)"
        )
    if current == who:
        return who, Step("agent", "unchanged", f"lease.agent = {who}")
    _set(repo, "lease.agent", who)
    return who, Step("agent", "set", f"lease.agent = {who}")


def _key(repo: Repo, who: str, key: str | None, want: bool, decide: Callable[[str], bool]) -> tuple[Step, str | None]:
    from gitlease.identity.signer import load_signer

    current = _config(repo, "lease.signingKey")
    if key is None and current:
        signer = load_signer(current)  # ConfigError (exit 1) if unreadable: said, not papered over
        return Step("key", "unchanged", f"lease.signingKey = {current} ({signer.fingerprint})"), signer.public_key
    if key is not None:
        signer = load_signer(key)
        if current == key:
            return Step("key", "unchanged", f"lease.signingKey = {key}"), signer.public_key
        _set(repo, "lease.signingKey", key)
        return Step("key", "set", f"lease.signingKey = {key} ({signer.fingerprint})"), signer.public_key
    if not want:
        return Step("key", "skipped", "unsigned (no lease.remote; --sign to sign anyway)"), None
    path = os.path.expanduser(os.path.join("~", ".ssh", "gitlease_" + re.sub(r"[^A-Za-z0-9._-]", "_", who)))
    if os.path.exists(path):
        signer = load_signer(path)
        _set(repo, "lease.signingKey", path)
        return Step("key", "set", f"lease.signingKey = {path} (existing key, {signer.fingerprint})"), signer.public_key
    if not decide(f"create an Ed25519 signing key for {who} at {path}?"):
        return (
            Step(
                "key",
                "skipped",
                f"no key: not created without a yes (without a terminal to ask on, re-run with --yes to create "
                f"{path}; or --key PATH)",
            ),
            None,
        )
    from gitlease.identity.sshsig import generate_key

    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    made = generate_key(path, comment=who)
    _set(repo, "lease.signingKey", path)
    return Step("key", "set", f"created {path} ({made.fingerprint()}); lease.signingKey = {path}"), made.public_key()


def _signing(repo: Repo) -> Step:
    """``git commit`` signs with the lease key (identity.signer.commit_signing_config): per worktree in a linked
    worktree with ``extensions.worktreeConfig``, else for the whole clone."""
    from gitlease.identity.signer import commit_signing_config

    pairs = commit_signing_config(_config(repo, "lease.signingKey"))
    linked = os.path.abspath(repo.git_dir) != os.path.abspath(repo.common_dir)
    per_worktree = linked and gitq.config_get(repo.cwd, "extensions.worktreeConfig", type="bool") == "true"
    scope = "worktree" if per_worktree else "local"
    where = "this worktree's config" if per_worktree else "this clone's config"
    current = {k: gitq.config_get(repo.cwd, k, scope=scope) for k, _ in pairs}
    if all(current[k] == v for k, v in pairs):
        return Step("signing", "unchanged", f"commits are signed with lease.signingKey ({where})")
    was = current.get("user.signingKey")
    for k, v in pairs:
        gitq.config_set(repo.cwd, k, v, scope=scope)
    replaced = f"; it was {was}" if was and was != dict(pairs)["user.signingKey"] else ""
    return Step(
        "signing",
        "set",
        f"git commit signs with lease.signingKey (gpg.format=ssh, user.signingKey, commit.gpgSign in {where}"
        f"{replaced}): on a signed store a commit's Lease: claim counts only when its lease's key signed it",
    )


def _trust(repo: Repo, names: list[str], public: str, signer: str | None, decide: Callable[[str], bool]) -> Step:
    """This host's key trusted for ``names`` by the store: unchanged when it is, else published (on a yes) in
    this host's signer file (gitlease.ops.trust)."""
    from gitlease.core.config import resolve
    from gitlease.ops import trust as ops

    settings = resolve(repo.config)
    name = signer or ops.host_name()
    who = ",".join(names)
    trusted = _trusted(repo, settings, names, public)
    if trusted:
        return Step("trust", "unchanged", f"{who} trusted with this key ({trusted})")
    command = f"git lease trust add {name} --agents {who}"
    where = (
        f"publish {name}'s signer file to the default branch of {settings.remote}"
        if settings.remote
        else f"write {name}'s signer file, to commit to this repository's default branch"
    )
    if not decide(f"trust this key for {who}: {where}?"):
        return Step("trust", "todo", f"{command} (publishes .gitlease/signers/{name}.pub), or --no-push for review")
    try:
        got = ops.add(repo, settings, name, ops.signer_line(names, public))
    except GitLeaseError as exc:
        return Step("trust", "todo", f"{exc.message}; then: {command}")
    if got.action == "written":
        return Step(
            "trust", "set", f"wrote {got.path}; commit it to the default branch: readers trust only what is there"
        )
    return Step(
        "trust",
        "set",
        f"{got.action} {got.path} on {got.where} (commit {(got.commit or '')[:12]}): readers trust {who} now",
    )


def _trusted(repo: Repo, settings: Settings, names: list[str], public: str) -> str | None:
    """Where the store's trust says this key is trusted for every one of ``names`` (None: it does not, or the
    trust cannot be read now)."""
    from gitlease.core.clock import SYSTEM
    from gitlease.core.store import open_store
    from gitlease.identity.trust import load_trust

    try:
        trust = load_trust(
            open_store(repo.cwd, settings.remote),
            settings.allowed_signers,
            cache_dir=repo.shared_dir(),
            required=False,
        )
    except GitLeaseError:
        return None
    now = SYSTEM.now()
    if trust.signed and all(trust.trusted_for(n, public, now) for n in names):
        return trust.source
    return None


def _hooks(repo: Repo) -> Step:
    from gitlease.enforce.install import install

    try:
        changes = install(repo.cwd)
    except GitLeaseError as exc:
        return Step("hooks", "todo", exc.message)
    if all(c.action == "unchanged" for c in changes):
        return Step("hooks", "unchanged", ", ".join(c.name for c in changes) + " installed")
    return Step(
        "hooks",
        "set",
        "; ".join(f"{c.name} {c.action}" + (f" (kept {c.legacy} and chained)" if c.legacy else "") for c in changes),
    )


def _ci(repo: Repo, ci: str | None) -> Step:
    if ci is None:
        return Step(
            "ci",
            "skipped",
            "the pull-request check and the scheduled sweep: "
            "git lease ci install github|gitlab --job verify --job sweep",
        )
    if repo.worktree is None:
        raise ConfigError("ci needs a work tree (this repository is bare)")
    from gitlease.ops.templates import install as do_install

    written: list[str] = []
    unchanged: list[str] = []
    steps: list[str] = []
    for job in ("sweep", "verify"):
        try:
            got = do_install(repo.worktree, ci, job=job)
        except UsageError as exc:  # where the jobs install gitlease from: a choice only the user can make
            return Step(
                "ci", "todo", f"{exc.message}; then: git lease ci install {ci} --job sweep --job verify --install SPEC"
            )
        written += got.written
        unchanged += got.unchanged
        steps += [s for s in got.next_steps if s not in steps]
    if written:
        return Step("ci", "set", "wrote " + ", ".join(written) + "; next: " + "; ".join(steps))
    return Step("ci", "unchanged", ", ".join(unchanged) + " up to date")
