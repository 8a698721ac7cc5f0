# A test host's servers: HTTP on --http answering "<name>\n" to every GET (or, with
# --files DIR, the file of DIR the path names, when there is one: a package index;
# with --only-files too, 404 when there is none: an apt repository),
# the same over TLS on --tls (certificate and key files given), and a TCP echo on
# --echo that answers each line with "<name> <line>". Binds --bind (0.0.0.0 by
# default); prints "ready" once everything listens, then serves until killed.
import argparse
import http.server
import socket
import socketserver
import ssl
import threading

p = argparse.ArgumentParser()
p.add_argument("name")
p.add_argument("--bind", default="0.0.0.0")
p.add_argument("--http", type=int)
p.add_argument("--tls", type=int)
p.add_argument("--cert")
p.add_argument("--key")
p.add_argument("--echo", type=int)
p.add_argument("--files")
p.add_argument("--only-files", action="store_true")
a = p.parse_args()


def file_of(path):
    """The file of --files that `path` names (never outside it), or None."""
    if not a.files:
        return None
    import os
    root = os.path.realpath(a.files)
    rel = path.split("?", 1)[0].lstrip("/")
    full = os.path.realpath(os.path.join(root, rel))
    if not full.startswith(root + os.sep):
        return None
    if os.path.isdir(full):
        full = os.path.join(full, "index.html")
    return full if os.path.isfile(full) else None


class Answer(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        found = file_of(self.path)
        if found:
            with open(found, "rb") as f:
                body = f.read()
            base = found.rsplit("/", 1)[-1]
            if base.endswith(".html"):
                kind = "text/html"
            elif "." not in base:
                kind = "application/json"  # an npm package document
            else:
                kind = "application/octet-stream"
        elif a.only_files:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        else:
            body = (a.name + "\n").encode()
            kind = "text/plain"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Server(http.server.ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True


class Echo(socketserver.StreamRequestHandler):
    def handle(self):
        self.request.settimeout(10)
        for line in self.rfile:
            self.wfile.write(("%s %s\n" % (a.name, line.decode().strip())).encode())
            self.wfile.flush()


class EchoServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


servers = []
if a.http:
    servers.append(Server((a.bind, a.http), Answer))
if a.tls:
    s = Server((a.bind, a.tls), Answer)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(a.cert, a.key)
    s.socket = ctx.wrap_socket(s.socket, server_side=True)
    servers.append(s)
if a.echo:
    servers.append(EchoServer((a.bind, a.echo), Echo))
for s in servers:
    threading.Thread(target=s.serve_forever, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
