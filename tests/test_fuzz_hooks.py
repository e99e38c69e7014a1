"""Fuzzing what git (or whoever runs a hook by hand) feeds the hooks: the pre-push hook's
``<local ref> <local oid> <remote ref> <remote oid>`` lines, the server pre-receive hook's ``<old> <new> <ref>``
lines, push options (GIT_PUSH_OPTION_COUNT / GIT_PUSH_OPTION_N) and ``Lease:`` commit trailers.

Properties, against real repositories and a real bare remote:
* never an exception other than a GitLeaseError (which the entry points turn into one line and an exit code);
  the real entry points (the installed hooks, ``git lease server-hook``), run as processes for a sample, never
  print a traceback and exit with a documented code;
* fail closed: input with a malformed line is refused, and a push that carries a commit outside the held
  scope (pre-push) or inside another's lease (pre-receive) is refused whatever else the input holds; a push
  option or trailer claims a lease only when it names it exactly.

Each property runs a handful of examples by default (the suite stays fast) and many under the long hypothesis
profile (``make fuzz``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import cli, git
from hypothesis import given
from hypothesis import strategies as st
from test_hooks import acquire, commit

from gitlease.core.errors import GitLeaseError
from gitlease.enforce import claims as claims_mod
from gitlease.enforce import server as receive
from gitlease.enforce import verify
from testing.fuzz import event, examples, fuzz_settings, tally  # noqa: F401  (tally: an autouse fixture)

HEX = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")
REF = re.compile(r"[^\x00-\x20\x7f]+")
ZERO = "0" * 40
CODES = {0, 1, 2, 4, 5, 6}  # docs/hooks.md, "Exit codes"
BIN = os.path.dirname(sys.executable)


def judge(ok: bool, code: int, expectation, data) -> None:
    """A hook's verdict on ``data`` against the model's ``expectation()``: a documented exit code always; a
    refusal where the model refuses, a pass where it accepts (either where it says "any")."""
    assert code in CODES
    expected = expectation()
    event(f"{expected} -> exit {code}")
    if expected == "refuse":
        assert not ok and code != 0, data
    elif expected == "accept":
        assert ok and code == 0, data


def _env():
    return dict(os.environ, PATH=BIN + os.pathsep + os.environ["PATH"])


# ----------------------------------------------------------------------------------- strategies


def _oids(world):
    known = st.sampled_from([world.base, world.inside, world.outside, ZERO, "0" * 64])
    odd = st.one_of(
        st.text(alphabet="0123456789abcdef", min_size=40, max_size=40),
        st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
        st.sampled_from(
            [
                world.outside.upper(),
                world.outside[:39],
                world.outside + "0",
                " " + world.outside,
                world.outside + "\r",
                "HEAD",
                "--all",
                "-p",
                "",
                "@{-1}",
                world.outside[:12],
            ]
        ),
        st.text(max_size=50),
    )
    return st.one_of(known, known, known, known, known, odd)


def _refs():
    valid = st.sampled_from(
        [
            "refs/heads/main",
            "refs/heads/topic",
            "refs/heads/a\u2028b",
            "refs/heads/\u00e9t\u00e9",
            ":/fix bug",
            "HEAD^{/fix bug}",
            "(delete)",
            "refs/leases/id/lease_0000000000aaaaaa",
        ]
    )
    return st.one_of(
        valid,
        valid,
        valid,
        valid,
        st.sampled_from(
            [
                "refs/heads/main",
                "refs/heads/topic",
                "refs/tags/v1",
                "(delete)",
                "HEAD",
                "refs/leases/id/lease_0000000000aaaaaa",
                "refs/leases/scope/src",
                "refs/leases/junk",
                "HEAD^{/fix bug}",
                ":/fix bug",
                "refs/heads/a\u2028b",
                "refs/heads/a\x85b",
                "refs/heads/a\x1cb",
                "refs/heads/\u00e9t\u00e9",
                "refs/heads/a\tb",
                "",
                "refs/heads/x\r",
            ]
        ),
        st.text(max_size=30),
    )


def _line(fields, oids, refs):
    seps = st.one_of(st.just(" "), st.just(" "), st.just(" "), st.sampled_from(["  ", "\t", "\u00a0", "\r"]))
    structured = st.builds(
        lambda parts, s: s.join(parts), st.tuples(*[oids if f == "oid" else refs for f in fields]), seps
    )
    wrong_count = st.lists(st.one_of(oids, refs), min_size=0, max_size=7).map(" ".join)
    return st.one_of(
        structured, structured, structured, structured, structured, structured, wrong_count, st.text(max_size=80)
    )


def _well_formed(world, fields):
    """Lines as git writes them, of the commits the world knows (and a few it does not)."""
    known = st.sampled_from([world.base, world.inside, world.outside, ZERO, world.free])
    oid = st.one_of(known, known, known, known, st.text(alphabet="0123456789abcdef", min_size=40, max_size=40))
    local = st.sampled_from(["refs/heads/main", ":/fix bug", "HEAD^{/x y}", "(delete)", "refs/heads/a\u2028b", "HEAD"])
    remote = st.sampled_from(
        [
            "refs/heads/main",
            "refs/heads/topic",
            "refs/tags/v1",
            "refs/heads/a\u2028b",
            "refs/heads/a\x85b",
            "refs/leases/id/lease_0000000000aaaaaa",
        ]
    )
    parts = [oid if f == "oid" else (local if f == "local" else remote) for f in fields]
    return st.lists(st.tuples(*parts).map(" ".join), min_size=1, max_size=4).map(
        lambda lines: ("\n".join(lines) + "\n").encode()
    )


def _stdin(line, real_line, *, huge=b"", well_formed=st.nothing()):
    """Bytes for a hook's stdin: lines (maybe with the real line inserted), or raw bytes."""

    def join(lines, real, pos, trailing, encoding):
        if real:
            lines.insert(pos % (len(lines) + 1), real_line)
        text = "\n".join(lines) + ("\n" if trailing else "")
        return text.encode("utf-8", "surrogatepass") if encoding == "utf-8" else text.encode("latin-1", "replace")

    lines = st.builds(
        join,
        st.lists(line, max_size=4),
        st.booleans(),
        st.integers(0, 10),
        st.booleans(),
        st.sampled_from(["utf-8", "utf-8", "latin-1"]),
    )
    raw = st.one_of(st.binary(max_size=300), st.just(b""), st.just(b"\n\n"), st.just(b"\xff\xfe\x00 \x80\n"))
    big = st.just(huge) if huge else st.nothing()
    return st.one_of(lines, lines, lines, raw, big, well_formed, well_formed, well_formed)


def _hook_input(world, line, fields):
    """A hook's stdin: lines like ``line``, the world's bad line among them, 20,000 bad lines, or well-formed lines
    of ``fields`` naming the world's commits."""
    huge = (world.bad_line + "\n").encode() * 20000
    return _stdin(line, world.bad_line, huge=huge, well_formed=_well_formed(world, fields))


def _lines_of(data: bytes) -> list[str] | None:
    """What git's grammar says the input is: its non-empty lines (ref names are bytes, not always UTF-8)."""
    return [ln for ln in data.decode("utf-8", "surrogateescape").split("\n") if ln]


# ------------------------------------------------------------------------------------ pre-push


class PushWorld:
    pass


@pytest.fixture
def push_world(pushing, monkeypatch):
    """A clone holding a lease on src: INSIDE (touches src/a) may be pushed, OUTSIDE (docs/x) may not."""
    r, bare = pushing
    acquire(r, "src", ttl=86400)  # a run of this fuzz test outlasting the lease would refuse for that reason
    w = PushWorld()
    w.repo, w.url = r, bare.as_uri()
    w.base = git(r, "rev-parse", "HEAD").strip()
    assert commit(r, "docs/x", extra=("--no-verify",)).returncode == 0
    w.outside = git(r, "rev-parse", "HEAD").strip()
    git(r, "reset", "-q", "--hard", w.base)
    assert commit(r, "src/a").returncode == 0
    w.inside = git(r, "rev-parse", "HEAD").strip()
    w.free = w.inside  # for _well_formed
    w.bad_line = f"refs/heads/main {w.outside} refs/heads/main {w.base}"
    monkeypatch.chdir(r)
    return w


def push_expectation(world, data: bytes) -> str:
    """'refuse' (malformed, or OUTSIDE reaches the remote), 'accept' (only commits it may push), or 'any'."""
    lines = _lines_of(data)
    if lines is None:
        return "refuse"
    pushed, gained_outside = [], False
    for ln in lines:
        parts = ln.rsplit(" ", 3)
        if (
            len(parts) != 4
            or not parts[0]
            or not HEX.fullmatch(parts[1])
            or not HEX.fullmatch(parts[3])
            or not REF.fullmatch(parts[2])
        ):
            return "refuse"
        _, local, remote_ref, remote = parts
        if re.fullmatch("0+", local) and remote_ref.startswith(
            ("refs/leases/", "refs/leases-audit/", "refs/leases-quarantine/")
        ):
            return "refuse"  # a person's push never deletes gitlease's refs (gitlease's own writes skip hooks)
        if not re.fullmatch("0+", local) and not remote_ref.startswith("refs/leases/"):
            pushed.append(local)
            # each ref is judged by what it gains over its own remote value (deletes and lease refs are
            # skipped whole): OUTSIDE is gained unless that ref is at OUTSIDE already
            gained_outside = gained_outside or (local == world.outside and remote != world.outside)
    if gained_outside:
        return "refuse"
    return "accept" if set(pushed) <= {world.inside, world.base, world.outside} else "any"


def run_pre_push(world, data: bytes) -> tuple[bool, int]:
    try:
        ok, lines, code = verify.pre_push("origin", world.url, data)
    except GitLeaseError as exc:
        return False, exc.exit_code
    assert all("\n" not in ln for ln in lines)
    return ok, code


def check_pre_push(world, examples):
    oids, refs = _oids(world), _refs()
    line = _line(("ref", "oid", "ref", "oid"), oids, refs)

    @fuzz_settings(examples)
    @given(_hook_input(world, line, ("local", "oid", "remote", "oid")))
    def prop(data):
        ok, code = run_pre_push(world, data)
        judge(ok, code, lambda: push_expectation(world, data), data)

    prop()


def test_fuzz_pre_push_stdin(push_world):
    check_pre_push(push_world, examples(60, 2000))


def test_fuzz_pre_push_hook_process(push_world):
    """The installed hook, as git runs it: no traceback, a documented code, fail closed."""
    hook = os.path.join(
        git(push_world.repo, "rev-parse", "--path-format=absolute", "--git-path", "hooks").strip(), "pre-push"
    )
    oids, refs = _oids(push_world), _refs()
    line = _line(("ref", "oid", "ref", "oid"), oids, refs)

    @fuzz_settings(6)
    @given(_stdin(line, push_world.bad_line))
    def prop(data):
        res = subprocess.run([hook, "origin", push_world.url], cwd=push_world.repo, input=data, capture_output=True)
        err = res.stderr.decode("utf-8", "replace")
        assert "Traceback" not in err and res.returncode in CODES, err
        if push_expectation(push_world, data) == "refuse":
            assert res.returncode != 0

    prop()


def test_pre_push_ref_expressions_with_spaces_are_checked(push_world):
    """Regression (found by fuzzing): ``git push origin ':/fix bug:refs/heads/main'`` gives the hook a local ref
    with a space in it; the line was skipped as malformed and the push passed unchecked."""
    for local in (":/fix bug", "HEAD^{/fix bug}"):
        ok, code = run_pre_push(
            push_world, f"{local} {push_world.outside} refs/heads/main {push_world.base}\n".encode()
        )
        assert (ok, code) == (False, 4)
    ok, code = run_pre_push(push_world, f":/fix bug {push_world.inside} refs/heads/main {push_world.base}\n".encode())
    assert (ok, code) == (True, 0)
    # and through git itself: the commit message names the outside commit
    git(push_world.repo, "reset", "-q", "--hard", push_world.outside)
    res = subprocess.run(
        ["git", "push", "-q", "origin", "HEAD^{/change}:refs/heads/main"],
        cwd=push_world.repo,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 1 and "1 path outside the leases held here" in res.stderr


def test_pre_push_ref_names_with_unicode_line_separators_are_checked(push_world):
    """Regression (found by fuzzing): a branch named ``a<U+2028>b`` (a valid git ref name) was split into three
    malformed lines by str.splitlines and the push passed unchecked."""
    name = "a\u2028b"
    git(push_world.repo, "branch", name, push_world.outside)
    res = subprocess.run(
        ["git", "push", "-q", "origin", f"{name}:refs/heads/{name}"],
        cwd=push_world.repo,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 1 and "1 path outside the leases held here" in res.stderr


def test_pre_push_ref_names_that_are_not_utf8_are_checked(push_world):
    """A branch name may be any bytes git allows (Latin-1 here): checked like any other, not refused as junk."""
    name = b"lat\xe9"
    subprocess.run([b"git", b"branch", name, push_world.outside.encode()], cwd=push_world.repo, check=True)
    res = subprocess.run(
        [b"git", b"push", b"-q", b"origin", name + b":refs/heads/" + name], cwd=push_world.repo, capture_output=True
    )
    assert res.returncode == 1 and b"1 path outside the leases held here" in res.stderr
    ok, code = run_pre_push(
        push_world,
        b"refs/heads/lat\xe9 " + push_world.inside.encode() + b" refs/heads/lat\xe9 " + ZERO.encode() + b"\n",
    )
    assert (ok, code) == (True, 0)


def test_pre_push_malformed_input_refuses(push_world):
    for data in (
        b"junk\n",
        f"refs/heads/main {push_world.inside} refs/heads/main\n".encode(),
        f"refs/heads/main --output=x refs/heads/main {ZERO}\n".encode(),
        b"\xff\n",
    ):
        ok, code = run_pre_push(push_world, data)
        assert (ok, code) == (False, 2)
    assert not os.path.exists(push_world.repo / "x")
    assert run_pre_push(push_world, b"") == (True, 0) and run_pre_push(push_world, b"\n") == (True, 0)


# ---------------------------------------------------------------------------------- pre-receive


class ReceiveWorld:
    pass


@pytest.fixture
def receive_world(origin, monkeypatch):
    """A bare remote where agent-a holds svc. Pushed-but-not-landed commits (in the object store, on no ref, as
    in git's quarantine): OUTSIDE touches svc/f (refused), FREE touches free/h, CLAIMED touches svc/g with a
    ``Lease:`` trailer naming a's lease."""
    bare = origin.bare
    assert cli(bare, "install-hooks", "--server").returncode == 0
    a, b = origin("a"), origin("b")
    w = ReceiveWorld()
    w.lease = acquire(a, "svc", agent="agent-a", task="task-a")
    w.bare, w.b = bare, b
    w.base = git(b, "rev-parse", "HEAD").strip()
    made = {}
    for name, path, msg in (
        ("outside", "svc/f", "change"),
        ("free", "free/h", "change"),
        ("claimed", "svc/g", f"work\n\nLease: {w.lease}"),
    ):
        git(b, "checkout", "-q", "-b", name, w.base)
        assert commit(b, path, msg=msg, extra=("--no-verify",)).returncode == 0
        made[name] = git(b, "rev-parse", "HEAD").strip()
    git(bare, "fetch", "-q", str(b), "outside", "free", "claimed")  # objects only: FETCH_HEAD is no ref
    w.outside, w.free, w.claimed = made["outside"], made["free"], made["claimed"]
    w.inside = w.free  # for _oids
    w.bad_line = f"{w.base} {w.outside} refs/heads/main"
    monkeypatch.chdir(bare)
    monkeypatch.setattr(receive, "_TRUST_CACHE", [])
    for var in [k for k in os.environ if k.startswith("GIT_PUSH_OPTION")]:
        monkeypatch.delenv(var)
    return w


def receive_expectation(world, data: bytes, claimed_by_option: bool = False) -> str:
    lines = _lines_of(data)
    if lines is None:
        return "refuse"
    news = []
    gained_outside = False
    deletes_lease = False  # a release or a clear is a push of its own, of whole leases
    for ln in lines:
        parts = ln.split(" ", 2)
        if len(parts) != 3 or not HEX.fullmatch(parts[0]) or not HEX.fullmatch(parts[1]) or not REF.fullmatch(parts[2]):
            return "refuse"
        old, new, ref = parts
        lease_ref = ref == "refs/leases" or ref.startswith(("refs/leases/", "refs/leases-audit/"))
        if re.fullmatch("0+", new):
            deletes_lease = deletes_lease or lease_ref
            continue
        if lease_ref:
            return "refuse"  # none of our oids is a proper lease version
        news.append(new)
        # a ref is judged by the commits it gains over its own old value (an unknown one: over the default
        # branch, base): OUTSIDE is gained unless the ref was at OUTSIDE already (base, FREE and CLAIMED are
        # not its descendants). A Lease: trailer claims only its own commit (CLAIMED), a push option all.
        if new == world.outside and old != world.outside and not claimed_by_option:
            gained_outside = True
    if gained_outside or (deletes_lease and news):
        return "refuse"
    if deletes_lease:
        return "any"
    return "accept" if set(news) <= {world.base, world.free, world.claimed, world.outside} else "any"


def run_pre_receive(data: bytes) -> tuple[bool, int]:
    try:
        refusals, notes = receive.pre_receive(data)
    except GitLeaseError as exc:
        return False, exc.exit_code
    assert all("\n" not in ln for ln in refusals + notes)
    return not refusals, 4 if refusals else 0


def check_pre_receive(world, examples):
    line = _line(("oid", "oid", "ref"), _oids(world), _refs())

    @fuzz_settings(examples)
    @given(_hook_input(world, line, ("oid", "oid", "remote")))
    def prop(data):
        ok, code = run_pre_receive(data)
        judge(ok, code, lambda: receive_expectation(world, data), data)

    prop()


def test_fuzz_pre_receive_stdin(receive_world):
    check_pre_receive(receive_world, examples(60, 2000))


def _option_values(lease):
    fullwidth = "lease=" + lease.replace("_", "\uff3f")
    near = st.sampled_from(
        [
            f"lease={lease}",
            f"lease={lease}\n",
            f"lease= {lease}",
            f"LEASE={lease}",
            f"lease={lease.upper()}",
            f"lease={lease}x",
            f"lease={lease[:-1]}",
            f"{lease}",
            f"lease=lease_{'0' * 16}",
            f"lease={lease} ",
            f"lease={lease}\x00",
            fullwidth,
            "lease=",
            "",
        ]
    )
    return st.one_of(st.just(f"lease={lease}"), near, near, st.text(max_size=40))


def check_push_options(world, examples):
    @fuzz_settings(examples)
    @given(
        st.one_of(
            st.integers(0, 6).map(str),
            st.integers(-3, 6).map(str),
            st.sampled_from(["", "x", "1e3", "99999999999999999999", " 2", "\u0662", "0x2"]),
            st.text(max_size=6),
        ),
        st.lists(_option_values(world.lease), max_size=5),
    )
    def prop(count, values):
        env = {"GIT_PUSH_OPTION_COUNT": count, **{f"GIT_PUSH_OPTION_{i}": v for i, v in enumerate(values)}}
        env = {k: v for k, v in env.items() if "\0" not in v}
        n = int(count) if count.isascii() and count.isdigit() else 0
        exact = any(env.get(f"GIT_PUSH_OPTION_{i}") == f"lease={world.lease}" for i in range(min(n, len(values))))
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            ok, code = run_pre_receive(f"{world.base} {world.outside} refs/heads/main\n".encode())
        event(f"claimed={exact}")
        assert ok == exact and code == (0 if exact else 4), (count, values)

    prop()


def test_fuzz_push_options(receive_world):
    check_push_options(receive_world, 30)


def test_push_option_count_that_is_huge_or_not_a_number(receive_world, monkeypatch):
    """Regression (found by fuzzing): a GIT_PUSH_OPTION_COUNT that is not a number was an internal error, a
    huge one looped for ever. Now: no claims from options (fail closed), the option named still counts."""
    data = f"{receive_world.base} {receive_world.outside} refs/heads/main\n".encode()
    for count in ("x", "", "-1"):
        monkeypatch.setenv("GIT_PUSH_OPTION_COUNT", count)
        assert run_pre_receive(data) == (False, 4)
    monkeypatch.setenv("GIT_PUSH_OPTION_COUNT", "9" * 30)
    monkeypatch.setenv("GIT_PUSH_OPTION_0", f"lease={receive_world.lease}")
    assert run_pre_receive(data) == (True, 0)
    monkeypatch.setenv("GIT_PUSH_OPTION_0", f"lease={receive_world.lease}\n")
    assert run_pre_receive(data) == (False, 4)


def check_trailers(world, examples):
    lid = world.lease
    tree = git(world.bare, "rev-parse", f"{world.outside}^{{tree}}").strip()
    value = st.one_of(
        st.sampled_from(
            [
                lid,
                f" {lid} ",
                lid.upper(),
                lid + "x",
                lid[:-1],
                f"<{lid}>",
                f"{lid}, lease_0000000000aaaaaa",
                "lease_" + "z" * 41,
            ]
        ),
        st.text(max_size=30),
    )
    value = st.one_of(st.just(lid), st.just(lid), value)
    key = st.one_of(st.just("Lease"), st.sampled_from(["Lease", "lease", "Lease ", "Leases", "X-Lease", "Lease-Id"]))
    sep = st.one_of(st.just(": "), st.sampled_from([": ", ":", " : ", "=", ": \n "]))
    trailer = st.builds(lambda k, s, v: f"{k}{s}{v}", key, sep, value)
    message = st.builds(
        lambda subject, body, trailers: f"{subject}\n\n{body}\n\n" + "\n".join(trailers) + "\n",
        st.text(max_size=20),
        st.text(max_size=40),
        st.lists(trailer, max_size=3),
    )

    @fuzz_settings(examples)
    @given(message)
    def prop(msg):
        msg = msg.replace("\0", "")
        res = subprocess.run(
            ["git", "commit-tree", "-p", world.base, "-F", "-", tree],
            cwd=world.bare,
            input=msg.encode("utf-8", "surrogatepass"),
            capture_output=True,
        )
        if res.returncode != 0:
            event("commit-tree failed")
            return
        new = res.stdout.decode().strip()
        ok, code = run_pre_receive(f"{world.base} {new} refs/heads/main\n".encode())
        event(f"exit {code}")
        if lid not in msg:
            assert (ok, code) == (False, 4), msg  # no claim without the exact lease id
        assert code in (0, 4)

    prop()


def test_fuzz_lease_trailers(receive_world):
    check_trailers(receive_world, 25)


def test_pre_receive_malformed_input_refuses(receive_world):
    w = receive_world
    for data in (
        b"junk\n",
        f"{w.base} {w.free}\n".encode(),
        f"{w.base} --output=x refs/heads/main\n".encode(),
        f"{w.base} {w.free} refs/heads/a\tb\n".encode(),
        b"\xff\xfe\n",
    ):
        assert run_pre_receive(data) == (False, 2), data
    assert not os.path.exists(w.bare / "x")
    # a ref name with U+2028 in it is one line (it used to be split in two by str.splitlines)
    assert run_pre_receive(f"{w.base} {w.free} refs/heads/a\u2028b\n".encode()) == (True, 0)
    assert run_pre_receive(f"{w.base} {w.outside} refs/heads/a\u2028b\n".encode()) == (False, 4)
    assert run_pre_receive(b"") == (True, 0)
    assert run_pre_receive(f"{w.base} {w.free} refs/heads/main\n".encode()) == (True, 0)


def test_fuzz_pre_receive_processes(receive_world):
    """The installed pre-receive hook and ``git lease server-hook pre-receive --json``: no traceback, a documented
    code, one JSON object on stdout for --json, fail closed."""
    w = receive_world
    hook = str(w.bare / "hooks" / "pre-receive")
    line = _line(("oid", "oid", "ref"), _oids(w), _refs())

    @fuzz_settings(4)
    @given(_stdin(line, w.bad_line))
    def prop(data):
        expected = receive_expectation(w, data)
        res = subprocess.run([hook], cwd=w.bare, input=data, capture_output=True, env=_env())
        err = res.stderr.decode("utf-8", "replace")
        assert "Traceback" not in err and res.returncode in CODES, err
        if expected == "refuse":
            assert res.returncode != 0
        res = subprocess.run(
            ["git", "lease", "server-hook", "pre-receive", "--json"],
            cwd=w.bare,
            input=data,
            capture_output=True,
            env=_env(),
        )
        err = res.stderr.decode("utf-8", "replace")
        assert "Traceback" not in err and res.returncode in CODES, err
        doc = json.loads(res.stdout)
        assert doc["ok"] == (res.returncode == 0)
        if not doc["ok"]:
            assert doc["error"]["exitCode"] == res.returncode
        if expected == "refuse":
            assert res.returncode != 0

    prop()


# ------------------------------------------------------------------- one walk for many ranges


@pytest.fixture(scope="module")
def dag(tmp_path_factory):
    """A repository holding a random-looking history of 40 commits (merges, two roots), written by one
    ``git fast-import``: commit k changes ``f/k`` and has up to two parents among the commits before it."""
    import random

    rnd = random.Random(35)
    repo = tmp_path_factory.mktemp("dag")
    git(repo, "init", "-q")
    chunks, parents = [], {}
    for k in range(1, 41):
        ps = [] if k in (1, 7) else rnd.sample(range(1, k), min(k - 1, rnd.choice((1, 1, 1, 2))))
        if k > 7 and 7 in ps and 1 in ps:
            ps = [7]
        parents[k] = ps
        head = "".join(f"{'from' if i == 0 else 'merge'} :{p}\n" for i, p in enumerate(ps))
        chunks.append(
            f"commit refs/dag/{k}\nmark :{k}\ncommitter t <t@t> {1700000000 + k} +0000\ndata 1\nc\n{head}"
            f"M 100644 inline f/{k}\ndata 2\n{k}\n\n"
        )
    subprocess.run(["git", "fast-import", "--quiet"], cwd=repo, input="".join(chunks).encode(), check=True)
    oids = git(repo, "for-each-ref", "--format=%(refname:lstrip=2) %(objectname)", "refs/dag/")
    return repo, {int(n): o for n, o in (ln.split() for ln in oids.splitlines())}


def range_paths(repo, new, bases):
    """What ``git log NEW --not BASES`` says each commit changes (``git show`` per commit: another reader)."""
    out = []
    for oid in git(repo, "rev-list", new, "--not", *bases, "--").split():
        text = git(repo, "show", "-z", "--format=", "--name-only", "--no-renames", "--cc", oid)
        out.append(claims_mod.Commit(oid, [p.lstrip("\n") for p in text.split("\0") if p.strip("\n")]))
    return out


def test_fuzz_one_walk_gains_what_a_walk_per_range_gains(dag):
    """``claims.gained`` walks every range at once (the pre-push and pre-receive hooks): it must find exactly
    the commits, and their paths, that ``git log NEW --not BASES`` finds range by range, whatever the ranges
    (shared, nested, crossing or unrelated bases, none at all)."""
    from gitlease.enforce import claims

    repo, oid = dag
    commits = st.sampled_from(sorted(oid))

    @fuzz_settings(examples(12, 300))
    @given(st.lists(st.tuples(commits, st.lists(commits, max_size=3)), min_size=1, max_size=6))
    def prop(ranges):
        ranges = [(oid[n], [oid[b] for b in bs]) for n, bs in ranges]
        want: dict[str, set[str]] = {}
        for new, bases in ranges:
            for c in range_paths(repo, new, bases):
                want[c.oid] = set(c.paths)
        got = {c.oid: set(c.paths) for c in claims.gained(repo, ranges)}
        assert got == want
        event(f"{len(want)} commits")

    prop()
