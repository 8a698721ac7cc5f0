# A minimal RFC 6455 WebSocket echo server, stdlib only: the opening handshake, masked
# client frames (text, binary, continuations), ping -> pong, close echoed. Each whole
# message comes back with the opcode it was sent with.
# Usage: python3 ws_echo.py PORT
import base64
import hashlib
import socket
import struct
import sys
import threading

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_HEAD = 64 * 1024
MAX_MESSAGE = 16 * 1024 * 1024


class Reader:
    def __init__(self, conn, buffered):
        self.conn = conn
        self.buf = buffered

    def exact(self, n):
        while len(self.buf) < n:
            data = self.conn.recv(max(65536, n - len(self.buf)))
            if not data:
                raise EOFError
            self.buf += data
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def frame(opcode, payload):
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x80 | opcode, 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 127, n)
    return head + payload


def unmask(mask, data):
    # XOR with the 4-byte mask repeated, as one big integer (fast enough in pure Python).
    key = (mask * (len(data) // 4 + 1))[: len(data)]
    return (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(len(data), "big")


def handshake(conn):
    head = b""
    while b"\r\n\r\n" not in head:
        data = conn.recv(4096)
        if not data or len(head) > MAX_HEAD:
            return None
        head += data
    head, rest = head.split(b"\r\n\r\n", 1)
    headers = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    key = headers.get("sec-websocket-key")
    if headers.get("upgrade", "").lower() != "websocket" or not key:
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        return None
    accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
    conn.sendall(
        (
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + "\r\n\r\n"
        ).encode()
    )
    return Reader(conn, rest)


def serve(conn):
    with conn:
        try:
            reader = handshake(conn)
            if reader is None:
                return
            kind, message = None, b""
            while True:
                b0, b1 = reader.exact(2)
                fin, opcode = b0 & 0x80, b0 & 0x0F
                masked, n = b1 & 0x80, b1 & 0x7F
                if n == 126:
                    n = struct.unpack("!H", reader.exact(2))[0]
                elif n == 127:
                    n = struct.unpack("!Q", reader.exact(8))[0]
                if not masked or n > MAX_MESSAGE or len(message) + n > MAX_MESSAGE:
                    conn.sendall(frame(8, struct.pack("!H", 1002)))
                    return
                mask = reader.exact(4)
                data = unmask(mask, reader.exact(n)) if n else b""
                if opcode == 8:
                    conn.sendall(frame(8, data[:2]))
                    return
                if opcode == 9:
                    conn.sendall(frame(10, data))
                    continue
                if opcode == 10:
                    continue
                if opcode in (1, 2):
                    kind, message = opcode, data
                elif opcode == 0 and kind is not None:
                    message += data
                else:
                    conn.sendall(frame(8, struct.pack("!H", 1002)))
                    return
                if fin:
                    conn.sendall(frame(kind, message))
                    kind, message = None, b""
        except (EOFError, ConnectionError):
            return


listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", int(sys.argv[1])))
listener.listen(64)
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
