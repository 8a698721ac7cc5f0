# A test host's servers: HTTP on --http answering "<name>\n" to every GET, the same
# over TLS on --tls (certificate and key files given), and a TCP echo on --echo that
# answers each line with "<name> <line>". Binds --bind (0.0.0.0 by default); prints
# "ready" once everything listens, then serves until killed.
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
a = p.parse_args()


class Answer(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        body = (a.name + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
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
