"""A TCP proxy in front of Postgres that loses one COMMIT acknowledgement.

``LossyProxy(host, port)`` listens on 127.0.0.1 and forwards every byte. ``arm(n)``
picks the n-th COMMIT (1-based, counted across all connections from the call on):
the proxy forwards it, lets the server execute it, and when the server's
``CommandComplete COMMIT`` reply arrives it closes both sides instead of forwarding
it. The transaction is committed; the client sees a dropped connection: the
"COMMIT succeeded, its reply was lost" case (issue 11 item 8).

It parses just enough of the wire protocol (v3) to find message boundaries: the
client's first message is untyped (startup / SSL / cancel), every later one and every
server message is ``type byte + int32 length``. Use it with ``sslmode=disable``.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading


class LossyProxy:
    def __init__(self, host: str = "127.0.0.1", port: int = 5432) -> None:
        self.target = (host, port)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.armed: int | None = None  # commits still to let through before the lost one
        self.dropped = 0  # acknowledgements lost so far
        self.commits = 0
        self.closed = False
        threading.Thread(target=self._accept, daemon=True, name="lossy-proxy").start()

    def arm(self, n: int) -> None:
        with self.lock:
            self.armed = max(1, n)

    def disarm(self) -> None:
        with self.lock:
            self.armed = None

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            conn = _Conn(self, client, server)
            threading.Thread(target=conn.client_to_server, daemon=True).start()
            threading.Thread(target=conn.server_to_client, daemon=True).start()


class _Conn:
    def __init__(self, proxy: LossyProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy, self.client, self.server = proxy, client, server
        self.lose_next_commit_reply = False
        self.dead = False

    def kill(self) -> None:
        self.dead = True
        for s in (self.client, self.server):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def client_to_server(self) -> None:
        buf = b""
        started = False
        try:
            while not self.dead:
                data = self.client.recv(65536)
                if not data:
                    break
                buf += data
                out = b""
                while True:
                    if not started:
                        if len(buf) < 4:
                            break
                        (n,) = struct.unpack("!I", buf[:4])
                        if len(buf) < n:
                            break
                        out, buf = out + buf[:n], buf[n:]
                        started = True
                        continue
                    if len(buf) < 5:
                        break
                    (n,) = struct.unpack("!I", buf[1:5])
                    if len(buf) < 1 + n:
                        break
                    msg, buf = buf[: 1 + n], buf[1 + n :]
                    if msg[:1] in (b"Q", b"P") and b"COMMIT" in msg[5:].upper()[:200]:
                        self._saw_commit()
                    out += msg
                if out:
                    self.server.sendall(out)
        except OSError:
            pass
        self.kill()

    def _saw_commit(self) -> None:
        p = self.proxy
        with p.lock:
            p.commits += 1
            if p.armed is None:
                return
            p.armed -= 1
            if p.armed == 0:
                p.armed = None
                self.lose_next_commit_reply = True

    def server_to_client(self) -> None:
        buf = b""
        try:
            while not self.dead:
                data = self.server.recv(65536)
                if not data:
                    break
                buf += data
                out = b""
                while len(buf) >= 5:
                    (n,) = struct.unpack("!I", buf[1:5])
                    if len(buf) < 1 + n:
                        break
                    msg, buf = buf[: 1 + n], buf[1 + n :]
                    if self.lose_next_commit_reply and msg[:1] == b"C" and msg[5:11] == b"COMMIT":
                        # The server has committed: the client never hears of it.
                        with self.proxy.lock:
                            self.proxy.dropped += 1
                        self.kill()
                        return
                    out += msg
                if out:
                    self.client.sendall(out)
        except OSError:
            pass
        self.kill()
