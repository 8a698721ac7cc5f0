# A TCP echo server: every byte read is written back, on each connection.
# Usage: python3 tcp_echo.py PORT
import socket
import sys
import threading


def echo(conn):
    with conn:
        while True:
            data = conn.recv(65536)
            if not data:
                return
            conn.sendall(data)


listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", int(sys.argv[1])))
listener.listen(64)
while True:
    conn, _ = listener.accept()
    threading.Thread(target=echo, args=(conn,), daemon=True).start()
