"""Connections that each declare a large request body and send it a byte a second: a hostile client's load
(benchmarks/hostile_client.py, tests/reliability/test_key_admission.py)."""

import socket


def open_slow_senders(base_url: str, path: str, key: str, count: int, body_bytes: int = 10 << 20
                      ) -> list[socket.socket]:
    """`count` connections to `base_url` (http://host:port), each a POST to `path` with `key` that declares
    `body_bytes` and sends its first byte; non-blocking."""
    host, port = base_url.removeprefix("http://").split("/")[0].split(":")
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {body_bytes}\r\n\r\n{{").encode()
    connections = []
    for _ in range(count):
        connection = socket.create_connection((host, int(port)))
        connection.sendall(head)
        connection.setblocking(False)
        connections.append(connection)
    return connections


def tick(connections: list[socket.socket], open_: set[int], statuses: dict[int, int]) -> None:
    """One second's turn: each connection still open reads what came back (its status into `statuses`; a closed
    one leaves `open_`) or, with nothing to read, sends one more byte."""
    for i in list(open_):
        try:
            data = connections[i].recv(65536)
        except BlockingIOError:
            try:
                connections[i].send(b" ")
            except OSError:
                open_.discard(i)
            continue
        except OSError:
            data = b""
        if data.startswith(b"HTTP/1.1 "):
            statuses[i] = int(data[9:12])
        if not data:
            open_.discard(i)
