"""pytest fixtures for real git servers on 127.0.0.1 (``remote``, ``file_remote``, ``remote_file``,
``remote_daemon``, ``remote_http``, ``git_daemon``, ``http_server``); the servers themselves are
testing/servers.py, shared with the soak and the benchmarks."""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from testing.servers import (  # noqa: F401  (re-exported: tests import the servers from here)
    GitDaemon,
    HangingServer,
    SmartHTTPServer,
    _group_alive,
    free_port,
    make_bare,
)


@dataclass(frozen=True)
class Remote:
    kind: str  # "file" | "daemon" | "http"
    url: str
    path: Path  # the bare repository on disk


_names = itertools.count()


def _repo_name(request) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name).strip("-.")[:40] or "repo"
    return f"{stem}-{os.getpid()}-{next(_names)}.git"


def new_remote(kind: str, where, name: str) -> Remote:
    """A fresh bare repository ``name``: ``where`` is a server (daemon/http) or a directory (file)."""
    if kind == "file":
        path = make_bare(Path(where) / name)
        return Remote("file", path.as_uri(), path)
    path = where.make_bare(name)
    return Remote(kind, where.url_for(name), path)


def _session_server(tmp_path_factory, cls, folder):
    server = cls(tmp_path_factory.mktemp(folder))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def git_daemon(tmp_path_factory):
    """One ``git daemon`` for the session (started on first use)."""
    yield from _session_server(tmp_path_factory, GitDaemon, "git-daemon")


@pytest.fixture(scope="session")
def http_server(tmp_path_factory):
    """One smart-HTTP server for the session (started on first use)."""
    yield from _session_server(tmp_path_factory, SmartHTTPServer, "git-http")


@pytest.fixture
def remote_file(request, tmp_path_factory) -> Remote:
    """A fresh bare repository reached by a file:// URL."""
    return new_remote("file", tmp_path_factory.mktemp("remote"), "store.git")


@pytest.fixture
def file_remote(remote_file) -> Remote:
    """Same as ``remote_file``."""
    return remote_file


@pytest.fixture
def remote_daemon(request) -> Remote:
    """A fresh bare repository on the session's git daemon (git://)."""
    return new_remote("daemon", request.getfixturevalue("git_daemon"), _repo_name(request))


@pytest.fixture
def remote_http(request) -> Remote:
    """A fresh bare repository on the session's smart-HTTP server (http://)."""
    return new_remote("http", request.getfixturevalue("http_server"), _repo_name(request))


@pytest.fixture(params=["file", "daemon", "http"], ids=["file", "daemon", "http"])
def remote(request) -> Remote:
    """A fresh bare repository of each kind; a server starts only when a test uses its kind."""
    return request.getfixturevalue("remote_" + request.param)
