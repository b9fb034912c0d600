"""tests/nethosts.py: namespaced test hosts have their own addresses and reach one another (and the test
reaches them), a cut link drops their traffic while their processes run on and a restored one carries it
again, and everything made is removed afterwards: when the test passes, when it fails (the fixture's
finalizer), when the interpreter exits without closing (``atexit``) and after a run killed outright (the
next run's sweep). Skipped where network namespaces cannot be made (not root)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nethosts import NetHosts, leftovers, net_hosts, unavailable  # noqa: F401 (net_hosts: a fixture)

TESTS = Path(__file__).resolve().parent

SERVER = textwrap.dedent("""
    import socket, sys
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], 9999))
    s.listen()
    print("listening", flush=True)
    while True:
        c, _ = s.accept()
        c.sendall(b"hi")
        c.close()
""")

PROBE = textwrap.dedent("""
    import socket, sys
    try:
        c = socket.create_connection((sys.argv[1], 9999), timeout=float(sys.argv[2]))
        print(c.recv(2).decode())
    except OSError as e:
        print(type(e).__name__)
""")


def _probe_from(hosts: NetHosts, host_i: int | None, ip: str, timeout_s: float = 1.0) -> str:
    """Connect to ``ip``:9999 from host ``host_i`` (None: the root namespace): ``hi`` or the error's name."""
    argv = [sys.executable, "-c", PROBE, ip, str(timeout_s)]
    if host_i is None:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    else:
        proc = hosts.popen(hosts.hosts[host_i], argv, stdout=subprocess.PIPE, text=True)
        out, _ = proc.communicate(timeout=30)
        return out.strip()
    return done.stdout.strip()


def _serve(hosts: NetHosts, i: int) -> subprocess.Popen[str]:
    proc = hosts.popen(hosts.hosts[i], [sys.executable, "-c", SERVER, hosts.hosts[i].ip],
                       stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
    return proc


def test_hosts_have_their_own_addresses_and_a_cut_link_drops_traffic_until_restored(net_hosts) -> None:  # noqa: F811
    hosts = net_hosts(3)
    assert len({h.ip for h in hosts.hosts}) == 3 and all(len(h.veth) <= 15 for h in hosts.hosts)
    assert len(hosts.bridge) <= 15
    for h in hosts.hosts:
        addrs = subprocess.run(["ip", "-n", h.name, "-4", "-o", "addr"], capture_output=True, text=True).stdout
        assert f"{h.ip}/24" in addrs and "127.0.0.1" in addrs, addrs
    server = _serve(hosts, 1)
    target = hosts.hosts[1].ip
    assert _probe_from(hosts, 0, target) == "hi"
    assert _probe_from(hosts, None, target) == "hi"  # the root namespace reaches every host
    assert _probe_from(hosts, 1, "127.0.0.1") != "hi"  # its server is on its eth0 address only
    for how in ("drop", "down"):
        hosts.cut(hosts.hosts[1], how)
        assert _probe_from(hosts, 0, target) in ("TimeoutError", "OSError"), how
        assert _probe_from(hosts, None, target) in ("TimeoutError", "OSError"), how
        assert server.poll() is None  # the host runs on
        assert _probe_from(hosts, 1, target) == "hi"  # and reaches itself
        assert _probe_from(hosts, 2, hosts.hosts[0].ip) in ("TimeoutError", "OSError", "ConnectionRefusedError")
        hosts.restore(hosts.hosts[1])
        deadline = time.monotonic() + 10.0
        while _probe_from(hosts, 0, target) != "hi":
            assert time.monotonic() < deadline, f"not reachable again after restoring ({how})"
            time.sleep(0.2)


def test_close_removes_every_namespace_link_and_process(net_hosts) -> None:  # noqa: F811
    hosts = net_hosts(2)
    server = _serve(hosts, 0)
    made = leftovers(hosts.tag)
    assert sorted(made) == sorted([f"netns emx-{hosts.tag}-0", f"netns emx-{hosts.tag}-1", f"link {hosts.bridge}",
                                   f"link emx{hosts.tag}v0", f"link emx{hosts.tag}v1"])
    hosts.cut(hosts.hosts[1])
    assert hosts.close() == []
    assert server.poll() is not None
    assert leftovers(hosts.tag) == []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    assert hosts.tag not in netns and hosts.tag not in links
    assert hosts.close() == []  # idempotent


def _child_pytest(tmp_path: Path, body: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run a one-test pytest file (``body``, using the fixture) in a child; (its result, the tag it wrote)."""
    test = tmp_path / "test_inner.py"
    tag_file = tmp_path / "tag"
    test.write_text(textwrap.dedent(f"""
        import subprocess, sys
        sys.path.insert(0, {str(TESTS)!r})
        from nethosts import net_hosts  # noqa: F401
    """) + textwrap.dedent(body).replace("TAG_FILE", repr(str(tag_file))))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    return done, tag_file.read_text() if tag_file.exists() else ""


def test_the_fixture_cleans_up_when_the_test_fails(tmp_path: Path) -> None:
    why = unavailable()
    if why is not None:
        pytest.skip(f"namespaced test hosts: {why}")
    done, tag = _child_pytest(tmp_path, """
        def test_fails(net_hosts):
            hosts = net_hosts(2)
            sleeper = hosts.popen(hosts.hosts[0], ["sleep", "300"])
            open(TAG_FILE, "w").write(f"{hosts.tag} {sleeper.pid}")
            hosts.cut(hosts.hosts[1])
            assert False, "this test fails on purpose"
    """)
    assert done.returncode == 1 and "this test fails on purpose" in done.stdout, done.stdout + done.stderr
    tag, pid = tag.split()
    assert leftovers(tag) == [] and not _running(int(pid))


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, which nobody reaped yet, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_atexit_cleans_up_an_unclosed_run_and_the_next_run_sweeps_a_killed_one(tmp_path: Path) -> None:
    why = unavailable()
    if why is not None:
        pytest.skip(f"namespaced test hosts: {why}")
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(TESTS)!r})
        from nethosts import NetHosts
        hosts = NetHosts(2).start()
        sleeper = hosts.popen(hosts.hosts[0], ["sleep", "300"])
        print(hosts.tag, sleeper.pid, flush=True)
        if sys.argv[1] == "hang":
            time.sleep(300)
    """)
    # exits without closing: atexit removes everything
    done = subprocess.run([sys.executable, "-c", script, "exit"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    tag, pid = done.stdout.split()
    assert leftovers(tag) == [] and not _running(int(pid))
    # killed outright: its namespaces stay, and the next run removes them (and kills what ran in them)
    proc = subprocess.Popen([sys.executable, "-c", script, "hang"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        tag, pid = proc.stdout.readline().split()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert len(leftovers(tag)) == 5 and _running(int(pid))
        with NetHosts(1) as other:
            assert leftovers(tag) == [] and not _running(int(pid))
            assert other.tag != tag
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_the_free_subnet_avoids_this_machines_addresses(net_hosts) -> None:  # noqa: F811
    a, b = net_hosts(1), net_hosts(1)
    assert a.subnet != b.subnet and a.tag != b.tag
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    assert str(a.subnet) in routes and str(b.subnet) in routes
    assert routes.count(str(a.subnet)) == 1  # its own bridge's, no other
