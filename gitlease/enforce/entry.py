"""The program git's hooks run (``hooks/pre-commit``, ``hooks/pre-push``; the ``git-lease-hook`` script).

    git-lease-hook pre-commit            # what the installed hook runs on every commit
    git-lease-hook pre-push REMOTE URL   # refs on stdin, as git gives them
    git-lease-hook pre-edit              # an agent's pre-tool hook (JSON on stdin): gitlease/enforce/guard.py
    git-lease-hook pre-shell             # an agent's pre-tool hook for shell tools (a snapshot): enforce/shell.py
    git-lease-hook post-shell            # an agent's post-tool hook for shell tools: what the command changed
    git-lease-hook check-path PATH...    # any agent, any script: exit 0 may write, 4 refused

Speed is the point of this module: it runs on every commit. The installed hook starts Python with ``-S``
(no site: an editable install's path finder alone costs about 15 ms) and this module imports the standard
library only, and little of it (no subprocess, no dataclasses, no typing). The pre-commit path makes two git
calls: ``git config`` (for ``lease.enforce``) and ``git diff-index`` (the staged paths); others' leases are
looked up only when needed (``others`` mode, or to name who holds a refused path).

Its few git calls are the one exception to "every git call goes through ``gitcmd.run``": they are local,
read-only, and run with git's hook environment kept on purpose (``GIT_INDEX_FILE`` points at the index being
committed, which may be a temporary one). The pre-push path and everything slow use the library.

Only this module and the CLI print or exit.
"""

from __future__ import annotations

import os
import sys

from gitlease.core import hookgit
from gitlease.core.errors import GitLeaseError, InvalidRecord
from gitlease.enforce import rules as enforce

EMPTY_TREES = (
    "4b825dc642cb6eb9a060e54bf8d69288fbee4904",
    "6ef19b41225c5369f1c104d45d8d85efa9b057b53b14b4b9b939dd74decc5321",
)
DEFAULT_SKEW = 30


def _git(args, cwd: str | None = None) -> tuple[int, bytes]:
    """``git *args`` -> (exit code, stdout). stdin and stderr are /dev/null; the environment is kept."""
    got = hookgit.run(args, cwd=cwd)
    return got if got is not None else (-1, b"")  # None only past a timeout, and none is given


def git_dir() -> str:
    """This worktree's git dir: $GIT_DIR (git sets it for hooks of linked worktrees), else ``.git`` in the
    current folder (hooks run at the top of the worktree), else ask git."""
    env = os.environ.get("GIT_DIR")
    if env:
        return os.path.abspath(env)
    dot = os.path.abspath(".git")
    if os.path.isdir(dot):
        return dot
    try:
        with open(dot, encoding="utf-8") as fh:
            first = fh.readline().strip()
        if first.startswith("gitdir: "):
            return os.path.normpath(os.path.join(os.path.dirname(dot), first[len("gitdir: ") :]))
    except OSError:
        pass
    rc, out = _git(["rev-parse", "--absolute-git-dir"])
    if rc != 0:
        raise GitLeaseError("not inside a git repository")
    return out.decode("utf-8", "surrogateescape").strip()


def lease_config(cwd: str | None = None, also: str = "") -> dict[str, str]:
    """The ``lease.*`` keys (and ``extensions.refstorage``: where the refs are kept), lower-cased; ``also``: a
    regular expression of more keys, read in the same call."""
    rc, out = _git(["config", "-z", "--get-regexp", rf"^(lease\.|extensions\.refstorage${also})"], cwd=cwd)
    cfg: dict[str, str] = {}
    for item in out.decode("utf-8", "surrogateescape").split("\0"):
        if item:
            key, _, value = item.partition("\n")
            cfg[key.lower()] = value
    return cfg


def staged_paths(gdir: str) -> list[str]:
    """Every path the commit changes, both sides of a rename and deletions included. Concluding a merge:
    only the paths that differ from every parent (what the merge itself changes, as ``git log --cc`` sees it),
    not those the merged branch brings."""
    paths = _diff_index("HEAD")
    try:
        with open(os.path.join(gdir, "MERGE_HEAD"), encoding="ascii") as fh:
            heads = fh.read().split()
    except (OSError, ValueError):
        heads = []
    for oid in heads:
        if paths:
            keep = set(_diff_index(oid))
            paths = [p for p in paths if p in keep]
    return paths


def _diff_index(tree: str) -> list[str]:
    rc, out = _git(["diff-index", "--cached", "--name-only", "--no-renames", "-z", tree])
    if rc != 0 and tree != "HEAD":
        raise GitLeaseError(f"cannot compare the index with {tree} (git diff-index failed)")
    if rc != 0:  # no HEAD yet: the first commit; compare with the empty tree
        for tree in EMPTY_TREES:
            rc, out = _git(["diff-index", "--cached", "--name-only", "--no-renames", "-z", tree])
            if rc == 0:
                break
        else:
            raise GitLeaseError("cannot list the staged paths (git diff-index failed)")
    return enforce.zsplit(out)


def skew(cfg: dict[str, str]) -> int:
    """``lease.skew`` read as every other command reads it (gitlease.core.durations; unset: 30); anything else is
    a ConfigError (exit 1), never a silent default."""
    from gitlease.core.durations import seconds

    return seconds("lease.skew", cfg.get("lease.skew"), DEFAULT_SKEW, 0, 3600)


class RefView:
    """This repository's refs, read where git's files backend keeps them (a loose ref file, else the
    ``packed-refs`` file): only the refs asked for, no git process, so a hook costs the same with 10 or 10,000
    leases. ``get`` as a dict's. A repository whose refs are kept otherwise (reftable) is listed by git once."""

    def __init__(self, common: str, cfg: dict[str, str]) -> None:
        self.common = common
        self._packed: bytes | None = None
        self._listed: dict[str, str] | None = None
        if cfg.get("extensions.refstorage", "files").lower() != "files":
            self._listed = list_lease_refs(common)

    def get(self, name: str, default: str | None = None) -> str | None:
        if self._listed is not None:
            return self._listed.get(name, default)
        try:
            with open(os.path.join(self.common, name), "rb") as fh:
                line = fh.read(100).strip()
            if len(line) in (40, 64):
                int(line, 16)
                return line.decode("ascii")
            return default  # a symbolic or damaged ref: not one gitlease wrote
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            pass
        except ValueError:
            return default
        except OSError as exc:
            raise GitLeaseError(f"cannot read ref {name}: {exc.strerror}") from None
        return self._from_packed(name, default)

    def _from_packed(self, name: str, default: str | None) -> str | None:
        if self._packed is None:
            try:
                with open(os.path.join(self.common, "packed-refs"), "rb") as fh:
                    self._packed = b"\n" + fh.read()
            except FileNotFoundError:
                self._packed = b""
            except OSError as exc:
                raise GitLeaseError(f"cannot read packed-refs: {exc.strerror}") from None
        key = b" " + name.encode("utf-8", "surrogateescape") + b"\n"
        at = self._packed.find(key)
        if at < 0:
            return default
        start = self._packed.rfind(b"\n", 0, at) + 1
        return self._packed[start:at].decode("ascii", "replace")


def list_lease_refs(cwd: str | None = None) -> dict[str, str]:
    """Every ref under refs/leases/ (one ``git for-each-ref``)."""
    rc, out = _git(["for-each-ref", "--format=%(objectname) %(refname)", "refs/leases/"], cwd=cwd)
    if rc != 0:
        raise GitLeaseError("cannot list the lease refs (git for-each-ref failed)")
    refs = {}
    for line in out.decode("utf-8", "surrogateescape").splitlines():
        oid, _, ref = line.partition(" ")
        refs[ref] = oid
    return refs


class LocalLookup:
    """Others' leases as this repository last knew them, without the network: the repository's own refs
    (local store: only those a path needs, RefView), or the service's cache of the remote's last listing
    (``git lease status`` refreshes it). The pre-push hook and ``verify`` read the remote itself."""

    def __init__(self, gdir: str, cfg: dict[str, str], mine, now: float, read_records=None) -> None:
        self.gdir, self.cfg, self.now = gdir, cfg, now
        self.mine_grants = {m.grant for m in mine if m.grant}
        self.read_records = read_records or self.records  # the guard brings a reader that needs no json
        self._refs = None

    def local(self) -> bool:
        return self.cfg.get("lease.remote", "").strip() in ("", "local")

    def refs(self):
        """The local store's refs (a RefView), or the remote's last listing ({} when none was kept)."""
        if self._refs is None:
            if self.local():
                self._refs = RefView(enforce.common_dir(self.gdir), self.cfg)
            else:
                cached = enforce.load_refs_cache(enforce.common_dir(self.gdir), self.cfg["lease.remote"].strip())
                self._refs = cached[0] if cached else {}
        return self._refs

    def records(self, oids) -> dict:
        import json

        from gitlease.core import gitcmd

        oids = sorted(oids)
        if not oids:
            return {}
        res = gitcmd.run(
            ["cat-file", "--batch"], input="".join(f"{o}:lease.json\n" for o in oids).encode(), check=False
        )
        out, data, pos = {}, res.stdout, 0
        for oid in oids:
            nl = data.find(b"\n", pos)
            if nl < 0:
                break
            header = data[pos:nl].split(b" ")
            pos = nl + 1
            if len(header) == 3 and header[1] == b"blob" and header[2].isdigit():
                size = int(header[2])
                try:
                    out[oid] = json.loads(data[pos : pos + size].decode("utf-8"))
                except ValueError:
                    out[oid] = None
                pos += size + 1
            else:
                out[oid] = None
        return out

    def __call__(self, paths) -> dict:
        return enforce.holders_from_refs(
            paths, self.refs(), self.mine_grants, self.read_records, self.now, skew(self.cfg)
        )


def narrow_to_store(mine, lookup: LocalLookup) -> list:
    """``held.json`` may only narrow what the store grants: each held path must have its scope ref on the store
    pointing at the lease's grant, or it is refused as not held there (the local file was changed outside
    gitlease). Read without the network: the local store's own refs (a lease whose id ref is gone counts as
    lost); for a remote store, the last listing, and only when it has the version held.json last wrote (an
    older listing would not know a later extend)."""
    from gitlease.core.refnames import id_ref, scope_ref

    refs = lookup.refs()
    local = lookup.local()
    for m in mine:
        at = refs.get(id_ref(m.lease_id))
        if at is None and local:
            m.problem = "is gone from the lease store (released, or reclaimed)"
            continue
        if not local and (at is None or at not in m.current):
            continue  # the last listing predates what this worktree wrote: not judged here (pre-push is)
        kept = tuple(p for p in m.paths if refs.get(scope_ref(p)) == m.grant)
        if len(kept) != len(m.paths):
            m.ungranted = tuple(p for p in m.paths if p not in kept)
            m.paths = kept
    return mine


def pre_commit() -> int:
    import time

    gdir = git_dir()
    cfg = lease_config()
    configured = enforce.parse_mode(cfg.get("lease.enforce"))
    if configured == "off":
        return 0
    skew(cfg)  # a bad lease.skew is refused here as by every other command
    try:
        mine = enforce.load_held(os.path.join(gdir, "gitlease", "held.json"))
    except InvalidRecord as exc:
        if configured == "warn":
            _say([f"gitlease: warning (lease.enforce=warn): {exc.message}"])
            return 0
        _say([f"gitlease: commit refused: {exc.message}"])
        return exc.exit_code
    mode = enforce.effective_mode(configured, bool(mine))
    paths = staged_paths(gdir)
    if not paths:
        return 0
    now = time.time()
    check_mode = "others" if mode == "warn" and not mine else ("strict" if mode == "warn" else mode)
    lookup = LocalLookup(gdir, cfg, mine, now)
    violations = enforce.check(paths, narrow_to_store(mine, lookup), check_mode, now, lookup)
    if not violations:
        return 0
    warn = mode == "warn"
    _say(enforce.refusal("commit", check_mode, violations, warn=warn))
    return 0 if warn else enforce.exit_code(violations)


def pre_push(remote: str, url: str) -> int:
    """A push that provably touches no lease is let through by the lean path (enforce/quickpush.py); any
    other goes to the full check against the store (enforce/verify.py), with site-packages back on the path
    (the hook starts Python with ``-S``; a signed store's checks need ``cryptography``)."""
    data = sys.stdin.buffer.read()
    from gitlease.enforce import quickpush

    quick = quickpush.Quick(remote, url, data, lease_config(also=r"|remote\..*\.mirror$"), git_dir())
    if quick.allowed:
        return 0
    from gitlease.core.procs import site_packages

    site_packages()
    from gitlease.enforce.verify import pre_push as check_push

    ok, lines, code = check_push(remote, url, data, quick.given())
    if lines:
        _say(lines)
    quick.remember()
    return 0 if ok else code


def pre_receive() -> int:
    data = sys.stdin.buffer.read()
    from gitlease.enforce.server import pre_receive as check_receive

    refusals, notes = check_receive(data)
    _say([f"gitlease: {line}" for line in refusals + notes])
    return 4 if refusals else 0


def _say(lines) -> None:
    sys.stderr.write("".join(line + "\n" for line in lines))
    sys.stderr.flush()


USAGE = (
    "usage: git-lease-hook pre-commit | pre-push REMOTE URL | pre-receive | pre-edit | pre-shell | post-shell "
    "[AGENT] | check-path PATH..."
)
AGENT_HOOKS = ("pre-edit", "pre-shell", "post-shell")  # exit 2: the one code agents' hook runners take as "block"


DEADLINE = 90  # seconds: an agent hook answers before this, under the agents' own timeout (agenthooks.TIMEOUT)


def agent_hook(name: str) -> int:
    """``pre-edit`` / ``pre-shell`` / ``post-shell``: the payload on stdin; fail closed with exit 2 (any other
    code lets the agent's tool call through), unless the repository's lease.enforce is warn or off (decided in
    the guard), also when the check outlives DEADLINE (an agent lets a timed-out hook's call through). What
    goes to the model: stderr (a refusal), or JSON on stdout (post-shell's report: never in place of the
    command's output, so post-shell's own failures are reported there too, with exit 0)."""
    import time

    from gitlease.enforce import guard

    _deadline(name)
    try:
        data = sys.stdin.buffer.read()
        if name == "pre-edit":
            got = guard.pre_edit(data, time.time())
        else:
            from gitlease.enforce import shell

            got = (shell.pre_shell if name == "pre-shell" else shell.post_shell)(data, time.time())
    except KeyboardInterrupt:
        return 130
    except GitLeaseError as exc:
        return _hook_failed(name, exc.message)
    except Exception as exc:  # a bug: fail closed, one line, no traceback
        if os.environ.get("GITLEASE_DEBUG"):
            raise
        return _hook_failed(name, f"internal error: {type(exc).__name__}: {exc}")
    _say(got.lines)
    if got.stdout:
        sys.stdout.write(got.stdout + "\n")
    return got.code


def _hook_failed(name: str, message: str) -> int:
    if name == "post-shell":
        from gitlease.enforce.shell import context_json

        sys.stdout.write(context_json("PostToolUse", f"gitlease: the command's changes were not checked: {message}"))
        sys.stdout.write("\n")
        return 0
    _say([f"gitlease: {name} refused: {message}"])
    return 2


def _deadline(name: str) -> None:
    """Past DEADLINE seconds, a pre-tool hook refuses (exit 2) and post-shell stops quietly. ``_signal``: the C
    module under ``signal``, which imports enum (the hook stays cheap)."""
    import _signal  # type: ignore[import-not-found]

    def expired(signum, frame):
        if name != "post-shell":
            _say([f"gitlease: {name} refused: the check took over {DEADLINE} s (is git hanging?)"])
        sys.stderr.flush()
        os._exit(0 if name == "post-shell" else 2)

    _signal.signal(_signal.SIGALRM, expired)
    _signal.alarm(DEADLINE)


def check_path(paths: list[str]) -> int:
    import time

    from gitlease.enforce import guard

    got = guard.check_path(paths, time.time())
    _say(got.lines)
    return got.code


def run(argv: list[str]) -> int:
    if not argv:
        _say([USAGE])
        return 2
    if argv[0] in AGENT_HOOKS and len(argv) <= 2:  # the agent's name may follow (agent-hooks writes it)
        return agent_hook(argv[0])
    try:
        if argv[0] == "check-path" and len(argv) >= 2:
            return check_path(argv[1:])
        if argv[0] == "pre-commit":
            return pre_commit()
        if argv[0] == "pre-receive":
            return pre_receive()
        if argv[0] == "pre-push" and len(argv) >= 2:
            return pre_push(argv[1], argv[2] if len(argv) > 2 else argv[1])
        _say([USAGE])
        return 2
    except GitLeaseError as exc:
        _say([f"gitlease: {argv[0]} refused: {exc.message}"])
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: fail closed, one line, no traceback
        if os.environ.get("GITLEASE_DEBUG"):
            raise
        _say([f"gitlease: {argv[0]} refused: internal error: {type(exc).__name__}: {exc}"])
        return 1


def main() -> None:
    code = run(sys.argv[1:])
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


if __name__ == "__main__":
    main()
