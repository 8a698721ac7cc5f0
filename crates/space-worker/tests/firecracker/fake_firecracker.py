#!/usr/bin/python3
# A stand-in for the `firecracker` binary (tests/firecracker_api.rs): it serves the
# API on `--api-sock` as Firecracker does (one request per connection here), checks
# what it is given the way Firecracker would use it (the kernel, initramfs and drives
# opened as asked, a snapshot's files read at load), binds the vsock socket, writes a
# snapshot's files (with --keep-writing-memory it goes on writing to the memory file
# through the descriptor it wrote it with, as an escaped VMM could), and logs every request to `requests.log` in its working directory.
# It boots nothing.
import json
import socket
import sys
import threading
import time

args = sys.argv[1:]
api_path = args[args.index("--api-sock") + 1]
log = open("requests.log", "a")
server = socket.socket(socket.AF_UNIX)
server.bind(api_path)
server.listen(8)
state = "Not started"
held = []


def keep_writing(f):
    # Rewrites and grows the memory file it wrote, long after the snapshot was taken.
    for _ in range(200):
        time.sleep(0.01)
        f.seek(0)
        f.write(b"RAM REWRITTEN BY THE VMM" * 64)
        f.flush()


def answer(conn, status, body=b""):
    head = "HTTP/1.1 %d \r\n" % status
    if body:
        head += "Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    conn.sendall(head.encode() + b"\r\n" + body)


def fault(conn, e):
    answer(conn, 400, json.dumps({"fault_message": str(e)}).encode())


def listen(path):
    v = socket.socket(socket.AF_UNIX)
    v.bind(path)
    v.listen(8)
    held.append(v)


while True:
    conn, _ = server.accept()
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    length = 0
    for line in lines[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == "content-length":
            length = int(v)
    while len(body) < length:
        body += conn.recv(4096)
    req = json.loads(body) if body else None
    log.write(json.dumps([method, path, req]) + "\n")
    log.flush()
    try:
        if method == "GET" and path == "/version":
            answer(conn, 200, json.dumps({"firecracker_version": "1.10.1"}).encode())
        elif method == "GET" and path == "/":
            answer(conn, 200, json.dumps({"state": state, "id": "fake"}).encode())
        elif path == "/boot-source":
            open(req["kernel_image_path"], "rb").close()
            open(req["initrd_path"], "rb").close()
            answer(conn, 204)
        elif path.startswith("/drives/"):
            open(req["path_on_host"], "rb" if req["is_read_only"] else "r+b").close()
            answer(conn, 204)
        elif path == "/vsock":
            listen(req["uds_path"])
            answer(conn, 204)
        elif path == "/actions":
            state = "Running"
            answer(conn, 204)
        elif path == "/vm":
            state = "Paused" if req["state"] == "Paused" else "Running"
            answer(conn, 204)
        elif path == "/snapshot/create":
            if state != "Paused":
                raise Exception("the VM is not paused")
            open(req["snapshot_path"], "wb").write(b"state")
            mem = open(req["mem_file_path"], "wb")
            mem.write(b"ram")
            mem.flush()
            if "--keep-writing-memory" in args:
                # An escaped VMM's move: keep the descriptor, write through it later.
                held.append(mem)
                threading.Thread(target=keep_writing, args=(mem,), daemon=True).start()
            else:
                mem.close()
            answer(conn, 204)
        elif path == "/snapshot/load":
            open(req["snapshot_path"], "rb").read()
            open(req["mem_backend"]["backend_path"], "rb").read()
            # The vsock device comes back from the state, at its recorded path.
            listen("v.sock")
            state = "Running"
            answer(conn, 204)
        else:
            answer(conn, 204)
    except Exception as e:
        fault(conn, e)
    conn.close()
