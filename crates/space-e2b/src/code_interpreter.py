# SPACE's code-interpreter service: what E2B's `e2b-code-interpreter` SDK talks to on
# port 49999 of a sandbox made from template `code-interpreter-v1` (crates/space-e2b,
# interpreter.rs, starts it inside the sandbox; it runs with the sandbox's rights and no
# others). Python 3 standard library only.
#
#   POST /execute {code, context_id?, language?, env_vars?}
#        -> 200, chunked, one JSON object per line: {"type": "stdout"|"stderr", "text",
#           "timestamp"}, {"type": "result", "text", "is_main_result", ...},
#           {"type": "error", "name", "value", "traceback"},
#           {"type": "number_of_executions", "execution_count"}.
#   POST /contexts {language?, cwd?} -> {id, language, cwd}; GET /contexts -> [...];
#   DELETE /contexts/{id} -> 204; POST /contexts/{id}/restart -> 204.
#
# Each context is a Python process of its own (its globals live on between calls);
# code reaches it on a pipe, its events come back on another. A client that goes away
# mid-cell interrupts the cell (SIGINT). Bounds: a request body of 16 MiB, 64 contexts.

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = 49999
MAX_BODY = 16 << 20
MAX_CONTEXTS = 64

KERNEL = r'''
import ast, json, os, signal, sys, time, traceback
req = os.fdopen(int(sys.argv[1]), "r", encoding="utf-8")
ev = os.fdopen(int(sys.argv[2]), "w", encoding="utf-8", buffering=1)
def emit(**m):
    ev.write(json.dumps(m) + "\n")
class Stream:
    def __init__(self, name):
        self.name, self.pending = name, ""
    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str")
        self.pending += s
        if "\n" in self.pending:
            done, _, self.pending = self.pending.rpartition("\n")
            emit(type=self.name, text=done + "\n", timestamp=time.time_ns())
        return len(s)
    def flush(self):
        if self.pending:
            emit(type=self.name, text=self.pending, timestamp=time.time_ns())
            self.pending = ""
    def isatty(self):
        return False
def formats(value):
    out = {"text": repr(value)}
    for attr, key in (("_repr_html_", "html"), ("_repr_markdown_", "markdown"),
                      ("_repr_latex_", "latex"), ("_repr_json_", "json")):
        f = getattr(value, attr, None)
        if callable(f):
            try:
                got = f()
            except Exception:
                continue
            if got is not None:
                out[key] = got
    return out
scope = {"__name__": "__main__"}
count = 0
out, err = Stream("stdout"), Stream("stderr")
sys.stdout, sys.stderr = out, err
# An interrupt (the client went away) ends the cell under way, never the kernel.
signal.signal(signal.SIGINT, signal.SIG_IGN)
for line in req:
    cell = json.loads(line)
    count += 1
    signal.signal(signal.SIGINT, signal.default_int_handler)
    saved = dict(os.environ)
    os.environ.update(cell.get("env_vars") or {})
    try:
        tree = ast.parse(cell["code"], "<cell>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<cell>", "exec"), scope)
        if last is not None:
            value = eval(compile(last, "<cell>", "eval"), scope)
            if value is not None:
                scope["_"] = value
                out.flush(); err.flush()
                emit(type="result", is_main_result=True, **formats(value))
    except BaseException as e:
        out.flush(); err.flush()
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        # The kernel's own frames are not the cell's.
        tb = [t for t in tb if "<cell>" in t or not t.startswith("  File ")]
        emit(type="error", name=type(e).__name__, value=str(e), traceback="".join(tb))
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        out.flush(); err.flush()
        os.environ.clear(); os.environ.update(saved)
    emit(type="number_of_executions", execution_count=count)
    emit(type="end")
'''


class Context:
    def __init__(self, cid, cwd):
        self.id, self.cwd, self.lock = cid, cwd, threading.Lock()
        self.proc = None
        self.start()

    def start(self):
        req_r, req_w = os.pipe()
        ev_r, ev_w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-c", KERNEL, str(req_r), str(ev_w)],
            pass_fds=(req_r, ev_w), cwd=self.cwd, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(req_r)
        os.close(ev_w)
        self.req = os.fdopen(req_w, "w", encoding="utf-8", buffering=1)
        self.events = os.fdopen(ev_r, "r", encoding="utf-8")

    def stop(self):
        try:
            self.proc.kill()
            self.proc.wait()
        except OSError:
            pass
        for f in (self.req, self.events):
            try:
                f.close()
            except OSError:
                pass

    def view(self):
        return {"id": self.id, "language": "python", "cwd": self.cwd}


def default_cwd():
    for d in ("/home/user", os.environ.get("HOME") or "", "/"):
        if d and os.path.isdir(d):
            return d
    return "/"


contexts = {}
contexts_lock = threading.Lock()
default_id = None


def default_context():
    global default_id
    with contexts_lock:
        if default_id not in contexts:
            default_id = "default"
            contexts[default_id] = Context(default_id, default_cwd())
        return contexts[default_id]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body=None):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def refuse(self, status, message):
        self.answer(status, {"error": message})

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n < 0 or n > MAX_BODY:
            raise ValueError(f"a request body is at most {MAX_BODY} bytes")
        raw = self.rfile.read(n) if n else b"{}"
        got = json.loads(raw or b"{}")
        if not isinstance(got, dict):
            raise ValueError("the body must be a JSON object")
        return got

    def parts(self):
        return [p for p in self.path.split("?", 1)[0].split("/") if p]

    def do_GET(self):
        if self.parts() == ["contexts"]:
            with contexts_lock:
                return self.answer(200, [c.view() for c in contexts.values()])
        if self.parts() == ["health"]:
            return self.answer(200, {"status": "ok"})
        self.refuse(404, "no such path")

    def do_DELETE(self):
        p = self.parts()
        if len(p) == 2 and p[0] == "contexts":
            with contexts_lock:
                c = contexts.pop(p[1], None)
            if c is None:
                return self.refuse(404, f"context {p[1]} not found")
            c.stop()
            return self.answer(204)
        self.refuse(404, "no such path")

    def do_POST(self):
        p = self.parts()
        try:
            body = self.body()
        except ValueError as e:
            return self.refuse(400, str(e))
        if p == ["contexts"]:
            return self.new_context(body)
        if len(p) == 3 and p[0] == "contexts" and p[2] == "restart":
            with contexts_lock:
                c = contexts.get(p[1])
            if c is None:
                return self.refuse(404, f"context {p[1]} not found")
            with c.lock:
                c.stop()
                c.start()
            return self.answer(204)
        if p == ["execute"]:
            return self.execute(body)
        self.refuse(404, "no such path")

    def new_context(self, body):
        language = body.get("language") or "python"
        if language != "python":
            return self.refuse(400, f"SPACE's code interpreter runs python only, not {language!r}")
        cwd = body.get("cwd") or default_cwd()
        if not isinstance(cwd, str) or not os.path.isdir(cwd):
            return self.refuse(400, f"cwd {cwd!r} is not a directory")
        with contexts_lock:
            if len(contexts) >= MAX_CONTEXTS:
                return self.refuse(400, f"at most {MAX_CONTEXTS} contexts; remove one first")
            c = Context(uuid.uuid4().hex, cwd)
            contexts[c.id] = c
        self.answer(200, c.view())

    def execute(self, body):
        code = body.get("code")
        if not isinstance(code, str):
            return self.refuse(400, "code must be a string")
        language = body.get("language")
        if language not in (None, "python"):
            return self.refuse(400, f"SPACE's code interpreter runs python only, not {language!r}")
        env = body.get("env_vars") or {}
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            return self.refuse(400, "env_vars must map names to strings")
        cid = body.get("context_id")
        if cid:
            with contexts_lock:
                c = contexts.get(cid)
            if c is None:
                return self.refuse(404, f"context {cid} not found")
        else:
            c = default_context()
        with c.lock:
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                c.req.write(json.dumps({"code": code, "env_vars": env}) + "\n")
            except OSError:
                c.stop()
                c.start()
                c.req.write(json.dumps({"code": code, "env_vars": env}) + "\n")
            gone = False
            watcher = threading.Thread(target=self.watch, args=(c,), daemon=True)
            self.done = threading.Event()
            watcher.start()
            for line in c.events:
                if json.loads(line).get("type") == "end":
                    break
                if not gone:
                    try:
                        data = line.encode()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                    except OSError:
                        gone = True
                        self.interrupt(c)
            else:
                # The kernel died (killed, out of memory): a fresh one next time.
                c.stop()
                c.start()
                if not gone:
                    died = {"type": "error", "name": "KernelDied",
                            "value": "the context's Python process ended", "traceback": ""}
                    data = (json.dumps(died) + "\n").encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.done.set()
            if not gone:
                try:
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except OSError:
                    pass

    def watch(self, c):
        """Interrupts the cell when the client goes away before it ends."""
        sock = self.connection
        while not self.done.is_set():
            try:
                readable, _, _ = select.select([sock], [], [], 0.2)
                if not readable or self.done.is_set():
                    continue
                # Readable: at its end (the client left), or a next request.
                if sock.recv(1, socket.MSG_PEEK):
                    return
            except OSError:
                pass
            self.interrupt(c)
            return

    def interrupt(self, c):
        try:
            c.proc.send_signal(signal.SIGINT)
        except OSError:
            pass


def main():
    server = ThreadingHTTPServer.__new__(ThreadingHTTPServer)
    try:
        ThreadingHTTPServer.__init__(server, ("127.0.0.1", PORT), Handler)
    except OSError:
        # One is serving already (a second start is a no-op).
        return
    server.daemon_threads = True
    # Listening before the parent returns: whoever started this can connect at once.
    if os.fork():
        os._exit(0)
    os.setsid()
    # Nothing of the exec that started it is held: it returns at once.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    server.serve_forever()


main()
