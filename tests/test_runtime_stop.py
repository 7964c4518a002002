"""`coral serve` leaves no worker process behind: SIGTERM stops it cleanly (workers stopped,
exit status 0), and after SIGKILL, which nothing can catch, the workers notice that their
parent is gone and exit on their own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("zmq")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                reason="finds child processes through /proc (Linux)")

#: Generous bounds for a loaded 2-core machine; the test asserts outcomes, not speed.
START_TIMEOUT_S = 120.0
GONE_TIMEOUT_S = 30.0


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def _descendants(root: int) -> set[int]:
    """Every process whose chain of parents leads to `root`."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            parent[int(entry)] = st[1]
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - found
        found |= frontier
    return found


def _running(pids: set[int]) -> set[int]:
    """The pids still running (a zombie has exited; init reaps it when it gets to it)."""
    return {pid for pid in pids if (st := _stat(pid)) is not None and st[0] != "Z"}


def _free_port() -> int:
    from coral.runtime.worker import free_tcp_port
    return free_tcp_port()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_serve_leaves_no_worker_behind(sig, tmp_path):
    port = _free_port()
    log = (tmp_path / "serve.log").open("w")
    # its own session, so that whatever this test fails to stop can still be killed by group;
    # output to a file: a leftover worker holding a pipe open would hang the reader
    proc = subprocess.Popen(
        [sys.executable, "-m", "coral.cli.main", "serve", "--tiny", "--random-weights",
         "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "coral serve did not come up"
            time.sleep(0.2)
        children = _descendants(proc.pid)
        workers = {pid for pid in children
                   if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()}
        assert len(workers) == 3, f"expected 3 workers among {children}"

        proc.send_signal(sig)
        rc = proc.wait(timeout=GONE_TIMEOUT_S)
        deadline = time.time() + GONE_TIMEOUT_S
        while _running(children) and time.time() < deadline:
            time.sleep(0.1)
        left = _running(children)
        output = (tmp_path / "serve.log").read_text()
        assert not left, f"still running after {signal.Signals(sig).name}: {left}\n{output}"
        if sig == signal.SIGTERM:
            assert rc == 0, output  # stopped, not killed by the signal
        else:
            assert rc == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything of this test's session still there
        except ProcessLookupError:
            pass
        log.close()
