"""gradcomp's own TCPStore (gradcomp/tcp_store.py), what an env:// launch without torch meets
through: its client and server together, each against torch's (the same wire protocol), and the
errors of a client that finds no store or something else at the address."""
import datetime
import os
import socket
import subprocess
import threading
import time

import pytest
import torch.distributed as dist

from gradcomp import tcp_store, world
from paths import PY


@pytest.fixture
def server():
    s = tcp_store.StoreServer(0)
    yield s
    s.close()


def client(port, timeout=5.0, what="test"):
    return tcp_store.StoreClient("127.0.0.1", port, timeout, what)


def test_set_get_check_add_and_a_late_key(server):
    a, b = client(server.port), client(server.port)
    payload = bytes(range(256)) * 1000  # binary, 256 kB
    a.set("gradcomp/0/x", payload)
    assert b.get("gradcomp/0/x", 1.0) == payload
    assert b.check(["gradcomp/0/x"]) and not b.check(["gradcomp/0/x", "missing"])
    started = time.monotonic()
    assert b.get("missing", 0.3) is None and 0.3 <= time.monotonic() - started < 2.0
    assert b.get("missing", 0) is None
    threading.Timer(0.2, lambda: a.set("late", b"1")).start()
    assert b.get("late", 5.0) == b"1"
    assert a.add("n", 2) == 2 and b.add("n", 3) == 5


def test_many_ranks_meet_through_it(server):
    """64 clients at once, each setting its key and reading every other's."""
    errors = []

    def rank(r):
        try:
            c = client(server.port)
            c.set(f"k/{r}", str(r).encode())
            assert [c.get(f"k/{p}", 10.0) for p in range(64)] == [str(p).encode() for p in range(64)]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_torch_client_on_our_server(server):
    store = dist.TCPStore("127.0.0.1", server.port, 1, False, datetime.timedelta(seconds=10))
    ours = client(server.port)
    store.set("from-torch", "a")
    assert ours.get("from-torch", 1.0) == b"a"
    ours.set("from-us", b"b")
    store.wait(["from-us"], datetime.timedelta(seconds=5))
    assert store.get("from-us") == b"b" and store.check(["from-us"])
    assert store.add("count", 4) == 4 and ours.add("count", 1) == 5


def test_our_client_on_torch_server():
    store = dist.TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=10))
    ours = client(store.port)
    ours.set("from-us", b"\x00\x01")
    assert store.get("from-us") == b"\x00\x01"
    store.set("from-torch", "z")
    assert ours.get("from-torch", 1.0) == b"z" and ours.get("missing", 0.2) is None
    assert ours.add("count", 2) == 2 and store.add("count", 1) == 3


def test_no_store_at_the_address_is_named_within_the_timeout():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    started = time.monotonic()
    with pytest.raises(tcp_store.StoreError, match=rf"rank 2 of 4: no store answered at 127.0.0.1:{port} within 1 s"):
        client(port, timeout=1.0, what="rank 2 of 4")
    assert time.monotonic() - started < 5


def test_a_server_that_is_not_a_store_is_named():
    """Something else on MASTER_PORT (it accepts and says nothing) is an error, not a hang."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    with pytest.raises(tcp_store.StoreError, match=rf"rank 1 of 2: 127.0.0.1:{port} is not a TCPStore"):
        client(port, timeout=1.0, what="rank 1 of 2")
    listener.close()


def test_ranks_without_torch_meet_through_torchruns_agent_store(tmp_path):
    """Under torchrun the agent serves the store (TORCHELASTIC_USE_AGENT_STORE): ranks that
    cannot import torch connect to it with gradcomp's client and allreduce."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('not installed here')\n")
    job = ("import numpy as np, gradcomp.numpy as hvd\n"
           "try:\n    import torch\n    raise SystemExit('torch imported')\nexcept ImportError:\n    pass\n"
           "hvd.init()\n"
           "x = hvd.allreduce(np.full(1 << 16, hvd.rank() + 1, np.float32), op=hvd.Sum, name='x')\n"
           "import os\n"  # one write a line: the two ranks share torchrun's stdout
           "os.write(1, f'rank {hvd.rank()} of {hvd.size()} sum {x[0]}\\n'.encode())\n")
    hidden = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    r = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--no_python",
                        "env", f"PYTHONPATH={hidden}", PY, "-c", job], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert sorted(line for line in r.stdout.splitlines() if line.startswith("rank")) == \
        ["rank 0 of 2 sum 3.0", "rank 1 of 2 sum 3.0"], r.stdout


def test_master_port_that_is_no_port_or_is_taken_is_named(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "http")
    with pytest.raises(ValueError, match="MASTER_PORT='http' must be a port number"):
        world.own_store(0, 2)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    with socket.create_server(("", 0)) as taken:
        monkeypatch.setenv("MASTER_PORT", str(taken.getsockname()[1]))
        with pytest.raises(ValueError, match=rf"rank 0 of 2 cannot serve the job's store on "
                                             rf"MASTER_PORT={taken.getsockname()[1]}: "):
            world.own_store(0, 2)
