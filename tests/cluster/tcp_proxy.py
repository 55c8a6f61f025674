"""A TCP forwarder the database tests kill and restart to make PostgreSQL "go away" for slurmhet alone.

``python tcp_proxy.py LISTEN_PORT TARGET_PORT``: forwards 127.0.0.1:LISTEN_PORT to 127.0.0.1:TARGET_PORT until
killed; killing it drops every connection through it, as a database restart does. It works the same from the
Slurm chroots (the server itself lives on the host, out of their reach) and leaves the shared server alone.
"""

from __future__ import annotations

import socket
import sys
import threading


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def main(listen_port: int, target_port: int) -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", listen_port))
    server.listen(64)
    print("listening", flush=True)
    while True:
        client, _ = server.accept()
        upstream = socket.create_connection(("127.0.0.1", target_port))
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
