"""The pre-push hook's lean path: a push that provably touches no lease, allowed without the library.

The full check (enforce/verify.py ``pre_push``) imports the service to read the store into verified views,
then judges the pushed paths. Most pushes touch nothing any lease holds, and for them that import and that
read are the hook's whole cost (issue 35: 1.9x a push without the hook at 10,000 leases, against 1.4x asked).
This path answers those pushes with the standard library and four git processes (the configuration, the
store's one listing, ``ls-tree`` of the trust file at the store's HEAD, one ``git log`` of the pushed
ranges), and says "allowed" only when the full check would: every step that could find anything else says
"not sure" (``None``), and the hook runs the full check instead.

Allowed here only when all of these hold:

* ``lease.enforce`` is unset, ``others`` or ``warn`` (``off``: allowed at once, as the full check does), and
  this worktree holds no lease (no ``held.json`` entry: the rule is "outside others' leases" only);
* the push deletes none of gitlease's refs and is no mirror (``--mirror``, ``--prune``, a mirror remote);
* it goes to the lease store itself (``lease.remote`` is the push's remote or URL), and every pushed range
  starts from the same base, here: each ref's old value on the remote, or the store's HEAD for a new ref;
* the store is unsigned as ``identity/trust.load_trust`` reads it (neither trust file nor signers folder at
  its HEAD, or no HEAD commit at all; no ``lease.signingKey`` here): no trust file can make the full check
  refuse;
* the listing is exactly the one the digest (below) was written for, and no path the digest names overlaps a
  pushed path: ``core.bearing.restrict_refs`` would choose no ref, so the full check would read no lease and
  find nothing to refuse (an overlap is not a refusal: the full check decides it).

The digest (``cache/push-digest.marshal`` in gitlease's shared folder) is what that test needs of one listing,
kept so that it costs a hash, a comparison and a few set operations instead of a pass over every ref: a hash of
the listing (without its HEAD lines), the HEAD found to hold no trust file, every path its leases name, by each
listed commit's record (as the record cache, service/recordindex.py, holds it) and by each scope ref's name,
and the folders above those paths. ``remember`` writes it after a full check the lean path handed on, when
the full check before it saw the same listing, and only when every listed commit is in the record cache and
every scope ref decodes. Any change to the store's leases (an acquire, a renewal, a release) changes the
listing: the next pushes are checked in full until two in a row see one listing. So the lean path serves a
store quiet between pushes; a store with heartbeats running gets the full check nearly every time, listing the
store once all the same (``given``).

What it skips: the replay memory is not told of the leases listed (the next full read tells it; the memory
only narrows what a read accepts). A bug here is no refusal: the full check decides instead. What it costs:
docs/performance.md.
"""

from __future__ import annotations

import os

from gitlease.core import hookgit
from gitlease.core.errors import GitLeaseError
from gitlease.core.refnames import SCOPE_REF, path_of_scope_ref
from gitlease.enforce import rules

ZERO = frozenset("0")
HEX = frozenset("0123456789abcdef")
GITLEASE_REFS = ("refs/leases/", "refs/leases-audit/", "refs/leases-quarantine/")
NOT_PATHS = ("refs/leases/", "refs/leases-audit/")  # pushed refs that carry no work: the server hook's to judge
MAX_UPDATES = 1000  # more pushed refs than this: the full check (their ids would not fit one command line)
DEFAULT_SIGNERS = ".gitlease/allowed_signers"
SIGNERS_DIR = "signers"  # identity/trust.py's: the per-signer files beside the trust file
DIGEST = "push-digest.marshal"
LAST_KEY = "push-listing.key"  # the listing the last full check of a push saw (its hash): a digest is written
# only when the next one sees the same
DIGEST_FORMAT = 3  # bump when what the digest holds, how it is read, or how scope refs decode changes
SCOPE_DIR = SCOPE_REF + "/"


class Quick:
    """One push's lean check. ``allowed``: True when the full check would allow it, else None (not known
    here: the full check decides, reading this check's listing, ``given``; then ``remember``)."""

    def __init__(self, remote: str, url: str, data: bytes, cfg: dict[str, str], gdir: str) -> None:
        self.shared = os.path.join(rules.common_dir(gdir), "gitlease")
        self.store: str | None = None
        self.raw: bytes | None = None  # the listing as git wrote it
        self.key: bytes | None = None  # the hash of the same without its HEAD lines: what a digest is written for
        self.unsigned: tuple[str, str] | None = None  # (HEAD, trust file path) found to hold no trust file
        self.memory: tuple[int, bool] | None = None  # the replay memory's file, opened before the listing
        self.stale = False  # the digest was not this listing's: worth writing again after the full check
        try:
            self.allowed = self._allowed(remote, url, data, cfg, gdir)
        except Exception:  # noqa: BLE001 - a bug here must not refuse a push: the full check decides instead
            if os.environ.get("GITLEASE_DEBUG"):
                raise
            self.allowed = None
        if self.memory is not None and (self.allowed or self.raw is None):  # not handed to the full check
            os.close(self.memory[0])
            self.memory = None

    def given(self) -> tuple[str, tuple[int, bool] | None] | None:
        """The listing read here, for the full check to read instead of listing again (``Reader.listing``),
        with the replay memory as it was before it (the full check's rule: see identity/replay.Seen)."""
        if self.raw is None:
            return None
        return self.raw.decode("utf-8", "surrogateescape"), self.memory

    def _allowed(self, remote: str, url: str, data: bytes, cfg: dict[str, str], gdir: str) -> bool | None:
        try:
            mode = rules.parse_mode(cfg.get("lease.enforce"))
        except GitLeaseError:
            return None
        if mode == "off":
            return True
        if mode == "strict" or _holds_any(gdir):
            return None
        updates = _updates(data)
        if updates is None or _mirror(cfg, remote):
            return None
        if not updates:
            return True
        store = cfg.get("lease.remote")
        if store is None or store.strip() in ("", "local") or store not in (remote, url) or len(updates) > MAX_UPDATES:
            return None
        timeout = _timeout(cfg)
        if cfg.get("lease.signingkey") or timeout is None:
            return None
        self.memory = _open_memory(self.shared, store)
        argv = ["ls-remote", "--symref", store, "HEAD", "refs/leases/*"]
        listed = hookgit.run(argv, env=hookgit.clean_env(), timeout=timeout)
        if listed is None or listed[0] != 0:
            return None
        self.store, self.raw = store, listed[1]
        try:
            self.key, head = _listing_key(listed[1])
        except ValueError:
            return None
        bases = {old if old is not None else head for _new, old in updates}  # one base each
        base = bases.pop() if len(bases) == 1 else None
        if base is None:
            return None
        digest = _load(os.path.join(self.shared, "cache", DIGEST), store)
        fresh = digest is not None and digest[0] == self.key
        trust = (head or "", cfg.get("lease.allowedsignersfile") or DEFAULT_SIGNERS)
        if not (fresh and digest is not None and digest[1] == trust):  # a commit's tree never changes
            if not _unsigned(trust[1], head):
                return None
            self.unsigned = trust
        paths = _paths([new for new, _old in updates], [base])
        if paths is None:
            return None
        if not paths:
            return True
        if digest is None or not fresh:
            self.stale = True
            return None
        if _overlap(paths, digest[2], digest[3]):
            return None  # a lease bears on a pushed path: the full check judges it, and names it
        return True

    def remember(self) -> None:
        """After the full check of a push the digest did not answer: when the full check before it saw this
        same listing (the store is quiet: worth a digest), write the digest for it from the record cache, which
        that check has just filled; else only note this listing's key (``LAST_KEY``, 32 bytes), so a store whose
        leases move between pushes never pays for digests it cannot use (about 55 ms at 10,000 leases). Not
        written when a listed commit is not in the record cache or a scope ref cannot be decoded (the full check
        runs every time then). A cache: any failure only costs the next push."""
        if not self.stale or self.raw is None or self.key is None:
            return
        last = os.path.join(self.shared, "cache", LAST_KEY)
        try:
            with open(last, "rb") as fh:
                quiet = fh.read() == self.key
        except OSError:
            quiet = False
        if not quiet:
            _write(last, self.key)
            return
        from gitlease.service import recordindex

        index = recordindex.read(self.shared)
        words = b"".join(_without_head(self.raw)[0]).decode("utf-8", "surrogateescape").split()
        if index is None or len(words) % 2:
            return
        named: set[str] = set()
        for oid, ref in zip(words[0::2], words[1::2]):
            if oid not in index:
                return
            got = index[oid]
            if got is not None:
                named.update(got[1].split("\n"))
            if ref == SCOPE_REF or ref.startswith(SCOPE_DIR):
                try:
                    named.add(path_of_scope_ref(ref))
                except ValueError:
                    return  # a scope ref gitlease cannot have written blocks: the full check says what
        _save(os.path.join(self.shared, "cache", DIGEST), self.store, self.key, self.unsigned, named)


def _holds_any(gdir: str) -> bool:
    """Whether this worktree's ``held.json`` names a lease (or cannot be read: not known, so "yes")."""
    try:
        return bool(rules.load_held(os.path.join(gdir, "gitlease", "held.json")))
    except GitLeaseError:
        return True


def _updates(data: bytes) -> list[tuple[str, str | None]] | None:
    """The pushed refs that may carry paths, as (new value, old value on the remote or None for a new ref);
    None when a line is not what git writes, or the push deletes one of gitlease's refs."""
    out = []
    for line in data.decode("utf-8", "surrogateescape").splitlines():
        fields = line.split(" ")
        if len(fields) != 4 or not all(_is_oid(f) for f in (fields[1], fields[3])):
            return None
        _local_ref, new, ref, old = fields
        deleted = set(new) <= ZERO
        if deleted and ref.startswith(GITLEASE_REFS):
            return None
        if deleted or ref.startswith(NOT_PATHS):
            continue
        out.append((new, None if set(old) <= ZERO else old))
    return out


def _is_oid(text: str) -> bool:
    return len(text) in (40, 64) and set(text) <= HEX


def _mirror(cfg: dict[str, str], remote: str) -> bool:
    """Whether this push may delete what the remote has and this clone lacks (not listed to the hook): a
    mirror remote (any value but false), or ``git push --mirror``/``--prune`` (``mirror_command``)."""
    value = cfg.get(f"remote.{remote}.mirror".lower())
    if value is not None and value.strip().lower() not in ("false", "no", "off", "0"):
        return True
    return mirror_command()


def mirror_command() -> bool:
    """Whether the ``git push`` running this hook was given ``--mirror`` or ``--prune``: its command line, read
    from /proc (Linux), looking up through the hook script and any hook manager between."""
    pid = os.getppid()
    for _ in range(4):  # the hook script (sh), then git push; a hook manager may sit in between
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
            with open(f"/proc/{pid}/stat", "rb") as fh:
                pid = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if b"push" in argv and any(a in (b"--mirror", b"--prune") for a in argv):
            return True
    return False


def _timeout(cfg: dict[str, str]) -> float | None:
    """``lease.timeout`` in seconds as every command reads it; None when it does not read (the full check
    reports it)."""
    from gitlease.core.durations import seconds

    try:
        return float(seconds("lease.timeout", cfg.get("lease.timeout"), 30, 1, 3600))
    except GitLeaseError:
        return None


def _unsigned(path: str, head: str | None) -> bool:
    """Whether the store has no trust file (``path``) as identity/trust.load_trust reads it: its HEAD commit is
    here and holds neither that file nor its signers folder (one ``ls-tree``), or it has no HEAD commit."""
    if os.path.isabs(os.path.expanduser(path)):
        return False
    if head is None:
        return True
    argv = ["--literal-pathspecs", "ls-tree", "-r", "-z", "--full-tree", head, "--", path, signers_dir(path) + "/"]
    got = hookgit.run(argv, env=hookgit.clean_env())
    return got is not None and got[0] == 0 and not got[1]


def signers_dir(path: str) -> str:
    """identity/trust.signers_dir of a relative trust file path (a test holds them equal): the folder of
    per-signer files beside it."""
    return f"{path.rsplit('/', 1)[0]}/{SIGNERS_DIR}" if "/" in path else SIGNERS_DIR


def _paths(tips: list[str], bases: list[str]) -> list[str] | None:
    """Every path the commits ``tips`` reach and ``bases`` do not change (one ``git log``); None when git
    cannot answer (a base not here: the full check fetches it)."""
    got = hookgit.run(hookgit.touched_paths_args(tips, bases), env=hookgit.clean_env())
    if got is None or got[0] != 0:
        return None
    return sorted(set(rules.zsplit(got[1])))


def _open_memory(shared: str, store: str) -> tuple[int, bool] | None:
    """The replay memory's file, opened now (identity/replay.Seen.load_opened reads it later as it is now);
    None when there is none."""
    from gitlease.core.cachenames import seen_paths

    for legacy, path in enumerate(seen_paths(shared, store)):
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC), bool(legacy)
        except FileNotFoundError:
            continue
        except OSError:
            return None
    return None


def _without_head(raw: bytes) -> tuple[list[memoryview], str | None]:
    """A listing without the lines that name HEAD (``--symref``'s "ref: <branch>\tHEAD", and "<oid>\tHEAD"),
    as the pieces left (views, not copies), and HEAD's commit (None when the store has none); ValueError for a
    HEAD line git does not write."""
    cut: list[tuple[int, int]] = []
    at = raw.find(b"ref: ")
    if at == 0 or (at > 0 and raw[at - 1 : at] == b"\n"):
        cut.append(_line_at(raw, at))
    head = None
    at = raw.find(b"\tHEAD\n")
    while at >= 0 and cut and cut[0][0] <= at < cut[0][1]:  # the symref line's own "\tHEAD"
        at = raw.find(b"\tHEAD\n", at + 1)
    if at >= 0:
        start, end = _line_at(raw, at)
        head = raw[start:at].decode("ascii", "replace")
        if not _is_oid(head):
            raise ValueError("a HEAD line git does not write")
        cut.append((start, end))
    view, pieces, pos = memoryview(raw), [], 0
    for start, end in sorted(cut):
        pieces.append(view[pos:start])
        pos = end
    pieces.append(view[pos:])
    return pieces, head


def _line_at(raw: bytes, at: int) -> tuple[int, int]:
    """Where the line holding position ``at`` starts, and where the next one does."""
    end = raw.find(b"\n", at)
    return raw.rfind(b"\n", 0, at) + 1, len(raw) if end < 0 else end + 1


def _listing_key(raw: bytes) -> tuple[bytes, str | None]:
    """(BLAKE2b of the listing without its HEAD lines: which listing a digest is for; HEAD's commit)."""
    try:
        from _blake2 import blake2b  # CPython's own: no import of hashlib (OpenSSL) in the hook
    except ImportError:  # another interpreter
        from hashlib import blake2b
    pieces, head = _without_head(raw)
    h = blake2b(digest_size=32)
    for piece in pieces:
        h.update(piece)
    return h.digest(), head


def _overlap(paths: list[str], named: frozenset[str], folders: frozenset[str]) -> bool:
    """Whether one of ``paths`` (git's, of the pushed commits) overlaps a named path: is one, is below one (a
    named path is among the scopes containing it), or is above one (it is among the folders above the named
    paths, ``folders``): set operations only."""
    from gitlease.core.bearing import containing

    return not named.isdisjoint(containing(paths)) or not folders.isdisjoint(paths)


Digest = tuple  # (listing key, (HEAD, trust path) found unsigned or None, paths named, the folders above them)


def _load(path: str, store: str | None) -> Digest | None:
    """The digest kept for ``store`` (see ``Digest``), or None (none, another store's, another format,
    unreadable)."""
    import marshal

    from gitlease.service.recordindex import FORMAT

    try:
        with open(path, "rb") as fh:
            got = marshal.loads(fh.read())
    except (OSError, ValueError, EOFError, TypeError):
        return None
    if type(got) is not tuple or len(got) != 7 or got[:3] != (DIGEST_FORMAT, FORMAT, store):
        return None
    key, unsigned, named, folders = got[3:]
    if type(key) is not bytes or type(named) is not frozenset or type(folders) is not frozenset:
        return None
    return key, unsigned, named, folders


def _save(path: str, store: str | None, key: bytes, unsigned: tuple[str, str] | None, named: set[str]) -> None:
    import marshal

    from gitlease.core.bearing import folders_above
    from gitlease.service.recordindex import FORMAT

    doc = (DIGEST_FORMAT, FORMAT, store, key, unsigned, frozenset(named), frozenset(folders_above(named)))
    _write(path, marshal.dumps(doc))


def _write(path: str, data: bytes) -> None:
    """A cache file written whole (a failure only costs the next push what it would have saved)."""
    from gitlease.core.fsutil import atomic_write

    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, data)
    except OSError:
        pass
