import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gitlease.core import refnames, scope
from gitlease.core.errors import ScopeError


@pytest.mark.parametrize(
    "raw,norm",
    [
        ("services/billing", "services/billing"),
        ("./a//b/", "a/b"),
        ("a/./b", "a/b"),
        (".", "."),
        ("./", "."),
        ("a/", "a"),
        ("ünï/cødé", "ünï/cødé"),
        ("with space/x", "with space/x"),
        ("-leading-dash", "-leading-dash"),
    ],
)
def test_normalize(raw, norm):
    assert scope.normalize(raw) == norm


@pytest.mark.parametrize(
    "raw,why",
    [
        ("", "empty"),
        ("/abs/path", "absolute"),
        ("a/../b", "'..'"),
        ("..", "'..'"),
        (".git", ".git"),
        (".git/hooks", ".git"),
        ("a/.GIT/x", ".git"),
        ("a\x00b", "NUL"),
        ("a\nb", "control"),
        ("a\tb", "control"),
        ("a\\b", "backslash"),
        ("x" * 5000, "longer"),
    ],
)
def test_refused(raw, why):
    with pytest.raises(ScopeError) as err:
        scope.normalize(raw)
    assert why in str(err.value)
    assert err.value.exit_code == 2


def test_segment_aware():
    assert scope.contains("services/billing", "services/billing/x.py")
    assert not scope.overlaps("services/billing", "services/billing2")
    assert not scope.overlaps("services/tax", "services/billing")
    assert scope.overlaps("services", "services/billing/api.py")
    assert all(scope.overlaps(".", p) for p in ("a", "a/b", "."))


def test_minimize():
    assert scope.normalize_all(["a/b", "a", "c", "./c/d"]) == ("a", "c")
    assert scope.normalize_all(["a", "."]) == (".",)
    with pytest.raises(ScopeError):
        scope.normalize_all([])


segment = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="/\\\x00"), min_size=1, max_size=12
).filter(lambda s: s not in (".", "..") and s.lower() != ".git" and not any(ord(c) < 0x20 or ord(c) == 0x7F for c in s))
paths = st.lists(segment, min_size=0, max_size=4).map(lambda xs: "/".join(xs) or ".")


@given(paths, paths)
def test_overlap_symmetric(a, b):
    assert scope.overlaps(a, b) == scope.overlaps(b, a)


@given(paths, paths)
def test_contains_implies_overlaps(a, b):
    if scope.contains(a, b):
        assert scope.overlaps(a, b)


@given(st.text(max_size=40))
def test_normalize_idempotent(raw):
    try:
        once = scope.normalize(raw)
    except ScopeError:
        return
    assert scope.normalize(once) == once


@given(segment, segment)
def test_encoding_injective_and_invertible(a, b):
    ea, eb = refnames.encode_segment(a), refnames.encode_segment(b)
    assert refnames.decode_segment(ea) == a
    assert (ea == eb) == (a == b)


@given(st.lists(paths, min_size=1, max_size=3))
def test_overlap_matches_ref_prefix(ps):
    """Two scopes overlap exactly when one's ref components are a prefix of the other's: the D/F rule."""
    for a in ps:
        for b in ps:
            ra = refnames.to_ref_suffix(a).split("/") if a != "." else []
            rb = refnames.to_ref_suffix(b).split("/") if b != "." else []
            n = min(len(ra), len(rb))
            assert scope.overlaps(a, b) == (ra[:n] == rb[:n])


def test_encoded_refs_are_valid_ref_names():
    tricky = [
        "a.lock",
        ".hidden",
        "x..y",
        "end.",
        "@",
        "a@{b",
        "sp ace",
        "til~de",
        "ca^ret",
        "co:lon",
        "q?",
        "st*r",
        "br[acket",
        "ünï",
        "100%",
        "Cargo.toml",
        "-dash",
        "trailing.lock.lock",
        "...",
    ]
    names = [f"refs/leases/scope/{refnames.encode_segment(s)}" for s in tricky]
    for name in names:
        res = subprocess.run(["git", "check-ref-format", name], capture_output=True)
        assert res.returncode == 0, name
    assert len(set(names)) == len(names)


# --------------------------------------------------------------- the linear algorithms against the old ones

small_segment = st.sampled_from(["a", "b", "ab", "a-x", "a.b", "bc", "b0", "Ü", "a b"])
small_paths = st.lists(small_segment, min_size=0, max_size=4).map(lambda xs: "/".join(xs) or ".")


@given(st.lists(st.one_of(small_paths, paths), max_size=40))
def test_minimize_matches_the_pairwise_definition(ps):
    """The sort-and-scan minimize keeps exactly what the old every-pair one kept, in the same order."""
    assert scope.minimize(ps) == scope.minimize_quadratic(ps)


@given(st.lists(small_paths, min_size=1, max_size=40))
def test_minimize_is_minimal_and_covering(ps):
    kept = scope.minimize(ps)
    assert list(kept) == sorted(set(kept))
    assert all(not scope.contains(a, b) for a in kept for b in kept if a != b)
    assert all(scope.covers(kept, p) for p in ps)


def test_minimize_is_segment_aware():
    assert scope.minimize(["a/b", "a/b/c", "a/bc", "a/b-c", "a-b", "a"]) == ("a", "a-b")
    assert scope.minimize(["a/b", "a/b/c", "a/bc", "a/b-c"]) == ("a/b", "a/b-c", "a/bc")
    assert scope.minimize(["x", ".", "y/z"]) == (".",)
    wide = [f"w/{k}" for k in range(1000)] + [f"w/{k}/deep" for k in range(0, 1000, 7)]
    assert scope.minimize(wide) == tuple(sorted(f"w/{k}" for k in range(1000)))


ascii_raw = st.text(st.sampled_from(list("ab./\\-_ .gitGIT\x00\x7f\nü")), max_size=30)


@given(st.one_of(st.text(max_size=40), ascii_raw, paths, small_paths))
def test_normalize_fast_path_matches_the_full_check(raw):
    """``normalize``'s shortcut for canonical paths answers exactly as the full check: the same result, or a
    ScopeError with the same message."""

    def run(fn):
        try:
            return fn(raw)
        except ScopeError as exc:
            return ("refused", str(exc))

    assert run(scope.normalize) == run(scope._normalize)


def test_normalize_fast_path_leaves_long_and_odd_paths_to_the_full_check():
    long_seg = "x" * 251
    for raw in (long_seg, "a/" + long_seg, "/".join(["abcdefgh"] * 300), "a/.git", "a/.GiT/b", "a/./b", "a//b", "a/"):
        with_full = None
        try:
            with_full = scope._normalize(raw)
        except ScopeError as exc:
            with pytest.raises(ScopeError, match=str(exc)[:20].replace("(", r"\(").replace("'", "'")):
                scope.normalize(raw)
            continue
        assert scope.normalize(raw) == with_full


@given(st.lists(st.one_of(small_paths, paths), max_size=30), st.lists(st.one_of(small_paths, paths), max_size=30))
def test_sets_overlap_matches_every_pair(a, b):
    assert scope.sets_overlap(a, b) == any(scope.overlaps(x, y) for x in a for y in b)
