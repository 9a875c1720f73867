"""A key-value store over TCP that speaks torch.distributed's TCPStore protocol: what the ranks of
an env:// launch meet through when torch is not installed (world.own_store). Rank 0 serves it on
MASTER_PORT, as torch's env:// rendezvous does, unless torchrun's agent serves one already
(TORCHELASTIC_USE_AGENT_STORE): then every rank is a client of the agent's.

The wire format is torch 2's (torch/csrc/distributed/c10d/TCPStoreBackend.hpp): a query byte,
then its fields, strings and values as a 64-bit length and the bytes, in the machine's byte
order, keys under "/" as torch's client puts them. A client opens with VALIDATE and the magic
number; this module's client and server use VALIDATE, PING, SET, GET, CHECK, WAIT and ADD, which
is what torch's own client sends for set, get, check, wait and add, so either side may be
torch's (torch 1.13's store spoke an older protocol)."""
import itertools
import os
import socket
import struct
import threading
import time

MAGIC = 0x3C85F7CE
VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY = range(9)
PING = 13
READY, NOT_READY = 0, 1
STOP_WAITING = 0


class StoreError(RuntimeError):
    pass


def _read_exact(sock, n):
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        data += chunk
    return bytes(data)


def _read_u64(sock):
    return struct.unpack("=Q", _read_exact(sock, 8))[0]


def _read_bytes(sock):
    return _read_exact(sock, _read_u64(sock))


def _bytes(value):
    return struct.pack("=Q", len(value)) + value


def _key(key):
    """A key as torch's client sends it: under "/" (its TCPStore's key prefix)."""
    return _bytes(("/" + key).encode())


def _keys(keys):
    return struct.pack("=Q", len(keys)) + b"".join(_key(k) for k in keys)


class StoreServer:
    """The store's server: a thread accepting clients on `port` (0: any free one; `.port` says
    which) and a thread per client. Lives until close() or the process ends."""

    def __init__(self, port):
        self._data = {}
        self._changed = threading.Condition()
        self._listener = socket.create_server(("", port), backlog=1024, reuse_port=False)
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, name="gradcomp-store-server", daemon=True).start()

    def close(self):
        self._closed = True
        self._listener.close()

    def _accept(self):
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn,), name="gradcomp-store-client", daemon=True).start()

    def _serve(self, conn):
        with conn:
            try:
                if _read_exact(conn, 1)[0] != VALIDATE or struct.unpack("=I", _read_exact(conn, 4))[0] != MAGIC:
                    return  # not a store client: drop it, as torch's server does
                while True:
                    self._answer(conn, _read_exact(conn, 1)[0])
            except (ConnectionError, OSError):
                return

    def _answer(self, conn, query):
        """Reads one query's fields from `conn` and writes its answer."""
        if query == SET:
            key, value = _read_bytes(conn).decode(), _read_bytes(conn)
            with self._changed:
                self._data[key] = value
                self._changed.notify_all()
        elif query == GET:
            key = _read_bytes(conn).decode()
            with self._changed:
                self._changed.wait_for(lambda: key in self._data)
                conn.sendall(_bytes(self._data[key]))
        elif query in (CHECK, WAIT):
            keys = [_read_bytes(conn).decode() for _ in range(_read_u64(conn))]
            with self._changed:
                if query == WAIT:
                    self._changed.wait_for(lambda: all(k in self._data for k in keys))
                ready = all(k in self._data for k in keys)
            conn.sendall(bytes([STOP_WAITING if query == WAIT else READY if ready else NOT_READY]))
        elif query == ADD:
            key, amount = _read_bytes(conn).decode(), struct.unpack("=q", _read_exact(conn, 8))[0]
            with self._changed:
                total = int(self._data.get(key, b"0")) + amount
                self._data[key] = str(total).encode()
                self._changed.notify_all()
            conn.sendall(struct.pack("=q", total))
        elif query == PING:
            conn.sendall(_read_exact(conn, 4))
        else:
            raise ConnectionError(f"query {query} is not served")  # drops the client


class StoreClient:
    """A client of a TCPStore (torch's or StoreServer) at host:port, connecting for up to
    `timeout` seconds (the server may start after the client). Calls from several threads are
    taken one at a time."""

    _nonces = itertools.count(os.getpid())

    def __init__(self, host, port, timeout, what):
        self._lock = threading.Lock()
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._sock = socket.create_connection((host, port), timeout=max(1.0, deadline - time.monotonic()))
                break
            except OSError as e:
                if time.monotonic() >= deadline:
                    raise StoreError(f"{what}: no store answered at {host}:{port} within {timeout:.0f} s ({e}); "
                                     "rank 0 serves it on MASTER_ADDR:MASTER_PORT") from None
                time.sleep(0.1)
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        nonce = next(self._nonces) & 0xFFFFFFFF
        self._sock.sendall(bytes([VALIDATE]) + struct.pack("=I", MAGIC) + bytes([PING]) + struct.pack("=I", nonce))
        self._sock.settimeout(max(1.0, deadline - time.monotonic()))
        try:
            answer = struct.unpack("=I", _read_exact(self._sock, 4))[0]
        except (OSError, ConnectionError) as e:
            raise StoreError(f"{what}: {host}:{port} is not a TCPStore ({e})") from None
        if answer != nonce:
            raise StoreError(f"{what}: {host}:{port} is not a TCPStore (it answered a ping with {answer})")
        self._sock.settimeout(None)

    def set(self, key, value):
        with self._lock:
            self._sock.sendall(bytes([SET]) + _key(key) + _bytes(bytes(value)))

    def check(self, keys):
        with self._lock:
            self._sock.sendall(bytes([CHECK]) + _keys(keys))
            return _read_exact(self._sock, 1)[0] == READY

    def get(self, key, timeout):
        """`key`'s value, or None once `timeout` seconds passed without it (0: only looks)."""
        deadline, pause = time.monotonic() + timeout, 0.001
        while not self.check([key]):
            if time.monotonic() >= deadline:
                return None
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(2 * pause, 0.05)
        with self._lock:
            self._sock.sendall(bytes([GET]) + _key(key))
            return _read_bytes(self._sock)

    def add(self, key, amount):
        with self._lock:
            self._sock.sendall(bytes([ADD]) + _key(key) + struct.pack("=q", amount))
            return struct.unpack("=q", _read_exact(self._sock, 8))[0]
