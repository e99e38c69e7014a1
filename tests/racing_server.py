"""A git server that races: dulwich's receive-pack (from the package index), one thread per connection.

dulwich writes each ref of a push on its own and does not report a compare-and-swap it lost, so concurrent
pushers creating overlapping refs are all told they won: the server ``git lease doctor``'s concurrency probe
must fail. Run as ``python racing_server.py PORT REPO [DELAY] [serial]``: serves REPO as git://127.0.0.1:PORT/store.git,
says READY on stdout, and exits when its stdin closes (the test process went away). DELAY (seconds, default
0.2) is waited after a push's pack arrived and before its refs are written: a slow disk, which makes the race
show every time pushes overlap instead of now and then. The ref writes of one push at a time: dulwich ignores
a compare-and-swap it lost (``set_if_equals`` answering False is reported "ok"), but a ref lock file held by a
concurrent write makes it report "failed to write"; with writes one after another, every pusher whose ref
advertisement came before the first write (doctor's probe gates its pushers after the advertisement) is told
it won, however a loaded machine spreads them (writes at once let 3 rounds pass under 8 CPU hogs).
``serial``: dulwich's stock server, one connection at a time (it cannot race, and a push made while another is
connected waits for it)."""

from __future__ import annotations

import os
import socketserver
import sys
import threading


def main(port: int, path: str, delay: float, serial: bool = False) -> None:
    import time

    from dulwich.repo import Repo
    from dulwich.server import DictBackend, ReceivePackHandler, TCPGitServer

    apply_pack = ReceivePackHandler._apply_pack
    writing = threading.Lock()

    def slow_apply(self, refs):
        gen = apply_pack(self, refs)
        yield next(gen)  # the pack: received and stored
        time.sleep(delay)
        with writing:  # one push's ref writes at a time: the race is in the compare-and-swap, never a busy lock
            yield from gen

    ReceivePackHandler._apply_pack = slow_apply

    class Threaded(socketserver.ThreadingMixIn, TCPGitServer):
        daemon_threads = True

    cls = TCPGitServer if serial else Threaded
    server = cls(DictBackend({b"/store.git": Repo(path)}), "127.0.0.1", port)

    def lifeline() -> None:
        sys.stdin.read()
        os._exit(0)

    threading.Thread(target=lifeline, daemon=True).start()
    print("READY", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 0.2, "serial" in sys.argv[4:])
