"""OpenSSH's pattern matching (match.c): principal and namespace patterns of ``allowed_signers``.
Part of gitlease.identity.sshsig."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    pass

# --- OpenSSH pattern matching (match.c) -------------------------------------------------------------------

_STAR, _QMARK, _BANG, _COMMA = b"*?!,"
_MAX_SUBPATTERN = 1023  # match.c: a longer sub-pattern makes the whole list fail


def _match_pattern(s: bytes, p: bytes) -> bool:
    """``*`` = any run, ``?`` = any one byte, everything else literal; linear-time backtracking."""
    si = pi = 0
    star = -1
    mark = 0
    while si < len(s):
        if pi < len(p) and p[pi] == _STAR:
            star, mark = pi, si
            pi += 1
        elif pi < len(p) and (p[pi] == _QMARK or p[pi] == s[si]):
            si += 1
            pi += 1
        elif star >= 0:
            pi = star + 1
            mark += 1
            si = mark
        else:
            return False
    while pi < len(p) and p[pi] == _STAR:
        pi += 1
    return pi == len(p)


def _match_pattern_list(string: str, patterns: str) -> int:
    """OpenSSH match_pattern_list (case-sensitive): 1 if some sub-pattern matches and no ``!``-negated one does,
    -1 if a negated one matches, 0 otherwise."""
    s = string.encode("utf-8", "surrogatepass")
    subs = patterns.encode("utf-8", "surrogatepass").split(b",")
    if subs[-1] == b"":  # match.c never sees an empty last sub-pattern ("" or a trailing comma)
        subs.pop()
    got_positive = 0
    for sub in subs:
        negated = sub[:1] == b"!"
        if negated:
            sub = sub[1:]
        if len(sub) >= _MAX_SUBPATTERN:
            return 0
        if _match_pattern(s, sub):
            if negated:
                return -1
            got_positive = 1
    return got_positive
