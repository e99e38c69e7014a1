"""core/gitq.py: the git questions, and the pure parsers they read git's output with. Each parser is fed what
real git prints (a repository made here), plus the corners git's docs promise (spaces, newlines and quotes in
paths, renames, reasons with spaces) written out by hand."""

from __future__ import annotations

import os

import pytest
from conftest import git

from gitlease.core import gitq
from gitlease.core.errors import GitError
from gitlease.core.store import RefUpdate, parse_push_porcelain

ZERO = "0" * 40


def commit_file(repo, path, text, message="change"):
    full = repo / path
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_text(text)
    git(repo, "add", "--", path)
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


def fork(repo, on_main, on_side, side="side"):
    """(the base, a commit of ``on_main`` (path, text) on main, one of ``on_side`` on a new branch ``side`` from
    the base); the repository is left on ``side``."""
    base = gitq.head_commit(repo)
    ours = commit_file(repo, *on_main)
    git(repo, "checkout", "-q", "-b", side, base)
    return base, ours, commit_file(repo, *on_side)


# ------------------------------------------------------------------------------------ parsers


def test_parse_status_v2_reads_every_kind_and_paths_with_spaces():
    out = (
        "1 M. N... 100644 100644 100644 aaaa bbbb a file.txt\0"
        "1 .M N... 100644 100644 100644 aaaa aaaa dir/b\0"
        "2 R. N... 100644 100644 100644 aaaa aaaa R100 new name\0old name\0"
        "u UU N... 100644 100644 100644 100644 aaaa bbbb cccc both here\0"
        "? un tracked\0"
        "! build/\0"
    )
    assert gitq.parse_status_v2(out) == [
        gitq.StatusEntry("1", "M.", "a file.txt"),
        gitq.StatusEntry("1", ".M", "dir/b"),
        gitq.StatusEntry("2", "R.", "new name", "old name"),
        gitq.StatusEntry("u", "UU", "both here"),
        gitq.StatusEntry("?", "", "un tracked"),
        gitq.StatusEntry("!", "", "build/"),
    ]


def test_parse_status_v2_a_rename_source_is_never_an_entry():
    """The source of a rename is the next NUL item: spelled like an untracked line, it is still no entry."""
    out = "2 R. N... 100644 100644 100644 aaaa aaaa R100 b\0? a\0"
    assert gitq.parse_status_v2(out) == [gitq.StatusEntry("2", "R.", "b", "? a")]


def test_status_as_git_tells_it(make_repo):
    repo = make_repo()
    commit_file(repo, "moved me", "same\n")
    commit_file(repo, ".gitignore", "build/\n")
    (repo / "README").write_text("edited\n")
    git(repo, "mv", "moved me", "now here")
    (repo / "new file").write_text("n\n")
    (repo / "build").mkdir()
    (repo / "build" / "out.o").write_text("o\n")
    got = {(e.kind, e.path, e.orig) for e in gitq.status(repo, ignored=True)}
    assert got == {("1", "README", None), ("2", "now here", "moved me"), ("?", "new file", None), ("!", "build/", None)}
    assert {e.kind for e in gitq.status(repo, untracked=False)} == {"1", "2"}


def test_parse_worktree_list_reads_attributes_and_bare_flags():
    out = (
        "worktree /r\0HEAD " + "a" * 40 + "\0branch refs/heads/main\0\0"
        "worktree /r/wt one\0HEAD " + "b" * 40 + "\0detached\0locked gitlease: lease x (task t)\0\0"
        "worktree /gone\0HEAD " + "c" * 40 + "\0branch refs/heads/x\0prunable gitdir file points to non-existent\0\0"
    )
    got = gitq.parse_worktree_list(out)
    assert [w["worktree"] for w in got] == ["/r", "/r/wt one", "/gone"]
    assert got[1]["detached"] == "" and got[1]["locked"] == "gitlease: lease x (task t)"
    assert "locked" not in got[0] and got[2]["prunable"].startswith("gitdir")


def test_worktree_questions(make_repo, tmp_path):
    repo = make_repo()
    head = gitq.head_commit(repo)
    path = str(tmp_path / "wt one")
    gitq.worktree_add(repo, path, head, branch="task", lock_reason="gitlease: held (by me)")
    listed = {os.path.realpath(w["worktree"]): w for w in gitq.worktree_list(repo)}
    assert listed[os.path.realpath(path)]["locked"] == "gitlease: held (by me)"
    assert listed[os.path.realpath(path)]["branch"] == "refs/heads/task"
    assert gitq.worktree_unlock(repo, path) and not gitq.worktree_unlock(repo, path)
    assert gitq.worktree_move(repo, path, path + "2")
    assert gitq.worktree_remove(repo, path + "2").returncode == 0
    assert [w["worktree"] for w in gitq.worktree_list(repo)] == [str(repo)]


def test_parse_ls_remote_reads_symrefs_and_refs():
    out = f"ref: refs/heads/main\tHEAD\n{'a' * 40}\tHEAD\n{'a' * 40}\trefs/heads/main\n{'b' * 40}\trefs/leases/x\n"
    refs, symrefs = gitq.parse_ls_remote(out)
    assert refs == {"HEAD": "a" * 40, "refs/heads/main": "a" * 40, "refs/leases/x": "b" * 40}
    assert symrefs == {"HEAD": "refs/heads/main"}


def test_ls_remote_of_a_real_remote(make_repo, tmp_path):
    repo = make_repo()
    bare = tmp_path / "remote.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(bare))
    listed = gitq.ls_remote(repo, str(bare), "HEAD", "refs/heads/main", symref=True)
    head = gitq.head_commit(repo)
    assert listed.ok and listed.refs == {"HEAD": head, "refs/heads/main": head}
    assert listed.symrefs == {"HEAD": "refs/heads/main"}
    missing = gitq.ls_remote(repo, str(tmp_path / "nothing"), "HEAD")
    assert not missing.ok and missing.refs == {} and missing.err


def test_parse_config_z_and_a_bare_boolean():
    assert gitq.parse_config_z("lease.remote\norigin\0lease.ttl\n5m\0") == {"lease.remote": "origin", "lease.ttl": "5m"}
    assert gitq.parse_config_z("lease.note\nline one\nline two\0") == {"lease.note": "line one\nline two"}
    with pytest.raises(ValueError):
        gitq.parse_config_z("lease.enforce\0")


def test_config_questions(make_repo):
    repo = make_repo()
    gitq.config_set(repo, "lease.enforce", "strict")
    gitq.config_set(repo, "lease.flag", "yes")
    assert gitq.config_get(repo, "lease.enforce") == "strict"
    assert gitq.config_get(repo, "lease.flag", type="bool") == "true"
    assert gitq.config_matching(repo, r"^lease\.") == {"lease.enforce": "strict", "lease.flag": "yes"}
    assert gitq.config_unset(repo, "lease.flag") and gitq.config_get(repo, "lease.flag") is None
    assert not gitq.config_unset(repo, "lease.flag", check=False)


def test_parse_ls_files_tags_and_flagged_paths(make_repo):
    repo = make_repo()
    commit_file(repo, "skip me", "a\n")
    commit_file(repo, "assume", "b\n")
    git(repo, "update-index", "--skip-worktree", "skip me")
    git(repo, "update-index", "--assume-unchanged", "assume")
    assert sorted(gitq.flagged_paths(repo)) == ["assume", "skip me"]
    assert gitq.parse_ls_files_tags("H README\0S skip me\0h assume\0") == [
        ("H", "README"),
        ("S", "skip me"),
        ("h", "assume"),
    ]
    assert gitq.clear_flags(repo, ["assume", "skip me"]) and gitq.flagged_paths(repo) == []


def test_parse_log_paths_keeps_strange_paths_and_merges(make_repo):
    repo = make_repo()
    base, a, b = fork(repo, ("new\nline", "1\n"), ("side file", "2\n"))
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge", "side")
    (repo / "side file").write_text("changed in the merge\n")
    git(repo, "commit", "-q", "--amend", "-a", "--no-edit")
    merge = gitq.head_commit(repo)
    found = dict(gitq.paths_of_commits(repo, [merge, b, a]))
    assert found == {merge: ["side file"], b: ["side file"], a: ["new\nline"]}
    assert gitq.touched_paths(repo, [merge], [base]) == ["new\nline", "side file"]


def test_parse_log_paths_refuses_what_git_does_not_print():
    with pytest.raises(ValueError):
        gitq.parse_log_paths(b"\0not-an-oid\0\npath\0", ["a" * 40])
    oid = "a" * 40
    assert gitq.parse_log_paths(f"\0{oid}\0\npath one\0path two\0".encode(), [oid]) == [(oid, ["path one", "path two"])]


def test_commit_parents_and_read_objects(make_repo):
    repo = make_repo()
    first = gitq.head_commit(repo)
    second = commit_file(repo, "f", "x\n")
    got = gitq.read_objects(repo, [second, f"{second}:f", "nothing-here"])
    assert got[second][0] == "commit" and gitq.commit_parents(got[second][1]) == (first,)
    assert got[f"{second}:f"] == ("blob", b"x\n") and "nothing-here" not in got
    assert gitq.commit_parents(gitq.read_objects(repo, [first])[first][1]) == ()


def test_all_reached_walks_once_and_takes_no_argument_for_an_option(make_repo):
    repo = make_repo()
    first = gitq.head_commit(repo)
    second = commit_file(repo, "f", "x\n")
    git(repo, "checkout", "-q", "-b", "side", first)
    side = commit_file(repo, "g", "y\n")
    assert gitq.all_reached(repo, second, [first, second])
    assert not gitq.all_reached(repo, second, [first, side])  # side is not on it
    assert not gitq.all_reached(repo, second, ["--all"]) and not gitq.all_reached(repo, second, [first[:12]])


def test_parse_oid_ref_lines():
    assert gitq.parse_oid_ref_lines(f"{'a' * 40} refs/heads/x\n", " ") == {"refs/heads/x": "a" * 40}
    assert gitq.parse_oid_ref_lines(f"ref: refs/heads/main\tHEAD\n{'b' * 40}\tHEAD\n") == {"HEAD": "b" * 40}


# ---------------------------------------------------------------------------------- questions


def test_names_and_refs(make_repo):
    repo = make_repo()
    head = gitq.head_commit(repo)
    git(repo, "tag", "-a", "-m", "t", "v1")
    assert gitq.rev_parse_commit(repo, "v1") == head and gitq.rev_parse(repo, "v1") != head
    assert gitq.rev_parse_commit(repo, "nope") is None and gitq.rev_parse(repo, "--all") is None
    assert gitq.symbolic_full_name(repo, "main") == "refs/heads/main" and gitq.current_branch(repo) == "main"
    assert gitq.is_commit(repo, head) and not gitq.is_commit(repo, "1" * 40)
    assert gitq.valid_branch_name(repo, "feat/x") and not gitq.valid_branch_name(repo, "-x")
    assert not gitq.valid_ref_name(repo, "refs/heads/a..b")
    git(repo, "checkout", "-q", "--detach")
    assert gitq.current_branch(repo) is None


def test_update_ref_is_pinned(make_repo):
    repo = make_repo()
    head = gitq.head_commit(repo)
    assert gitq.update_ref(repo, "refs/gitlease/x", head, ZERO)
    assert not gitq.update_ref(repo, "refs/gitlease/x", head, ZERO, check=False)  # exists already
    with pytest.raises(GitError):
        gitq.update_ref(repo, "refs/gitlease/x", head, ZERO)
    assert not gitq.delete_ref(repo, "refs/gitlease/x", "1" * 40)
    assert gitq.delete_ref(repo, "refs/gitlease/x", head) and not gitq.ref_exists(repo, "refs/gitlease/x")


def test_counts_and_walks(make_repo):
    repo = make_repo()
    base = gitq.head_commit(repo)
    a = commit_file(repo, "a", "1\n")
    b = commit_file(repo, "b", "2\n")
    assert gitq.count_commits(repo, b, [base]) == 2 and gitq.rev_list(repo, [b], [base]) == [b, a]
    assert gitq.walk(repo, [b], [base], parents=True) == [f"{b} {a}", f"{a} {base}"]
    assert gitq.first_parents(repo, b, base, limit=10) == [b, a]
    assert gitq.root_commits(repo, b) == [base] and gitq.is_ancestor(repo, base, b)
    assert gitq.octopus_bases(repo, [a, b]) == [a]
    git(repo, "checkout", "-q", "-b", "other", base)
    assert gitq.count_unshared(repo, b, "main") == 2 and gitq.count_unshared(repo, b) == 0


def test_rebase_says_why_and_leaves_the_branch_as_it_was(make_repo):
    repo = make_repo()
    base, theirs, mine = fork(repo, ("README", "theirs\n"), ("README", "mine\n"), side="mine")
    why = gitq.rebase(repo, theirs)
    assert why and "could not apply" in why.lower()
    assert gitq.head_commit(repo) == mine and not gitq.status(repo)
    git(repo, "checkout", "-q", "-b", "clean", base)
    commit_file(repo, "other", "x\n")
    assert gitq.rebase(repo, theirs) is None and gitq.is_ancestor(repo, theirs, "HEAD")


def test_object_writes_in_a_scratch_index(make_repo, tmp_path):
    repo = make_repo()
    head = gitq.head_commit(repo)
    scratch = gitq.with_index(repo, str(tmp_path / "index"))
    gitq.read_tree(scratch, head)
    gitq.index_add(scratch, "dir/new", gitq.hash_object(repo, b"data\n"))
    gitq.index_remove(scratch, "README")
    tree = gitq.write_tree(scratch)
    commit = gitq.commit_tree(repo, tree, [head], "msg", ident=("Bot", "bot@example.invalid"))
    assert git(repo, "log", "-1", "--format=%an %ce", commit).strip() == "Bot bot@example.invalid"
    assert gitq.tree_paths(repo, commit) == ["dir/new"] and gitq.tree_paths(repo, "HEAD") == ["README"]
    assert not gitq.status(repo)  # the worktree's own index was never touched


def test_push_pins_every_ref(make_repo, tmp_path):
    """``gitq.push`` is the store's push (store.push_argv): a create pinned to "must not exist" lands once."""
    repo = make_repo()
    bare = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(bare))
    head = gitq.head_commit(repo)
    first = gitq.push(repo, str(bare), [RefUpdate("refs/leases/probe/x", head, None)])
    other = commit_file(repo, "f", "x\n")  # another object: the same one would be "up to date" (git-facts)
    again = gitq.push(repo, str(bare), [RefUpdate("refs/leases/probe/x", other, None)])
    assert parse_push_porcelain(first.out) == {"refs/leases/probe/x": "ok"}
    assert first.returncode == 0 and again.returncode != 0
    assert parse_push_porcelain(again.out)["refs/leases/probe/x"].startswith("rejected")


def test_a_server_hook_asks_in_its_own_repository(make_repo, monkeypatch, tmp_path):
    """``HOOK`` keeps the GIT_DIR git exported to the hook: the question is answered there, not in the cwd."""
    repo = make_repo()
    other = tmp_path / "elsewhere"
    git(tmp_path, "init", "-q", str(other))
    monkeypatch.chdir(other)
    monkeypatch.setenv("GIT_DIR", str(repo / ".git"))
    assert gitq.rev_parse_commit(gitq.HOOK, "HEAD") == git(repo, "rev-parse", "HEAD").strip()
    assert gitq.rev_parse_commit(str(other), "HEAD") is None  # a directory: its own repository, GIT_DIR dropped
