# An HTTP/1.1 server (keep-alive) for the service-port tests:
#   GET /headers -> the request's headers as JSON [[name, value], ...] (names lowercase)
#   GET /who     -> the tag given on the command line
# Usage: python3 http_app.py PORT TAG
import http.server
import json
import sys

PORT = int(sys.argv[1])
TAG = sys.argv[2].encode() if len(sys.argv) > 2 else b""


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path.startswith("/headers"):
            status = 200
            body = json.dumps([[k.lower(), v] for k, v in self.headers.items()]).encode()
        elif self.path.startswith("/who"):
            status, body = 200, TAG
        else:
            status, body = 404, b"no such path\n"
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
