"""The unmodified `e2b` Python SDK against SPACE's E2B front (crates/space/tests/e2b.rs).

Each scenario checks what the SDK gives back and prints `RESULT <json>` for the Rust
test; any failed check raises (the test sees the traceback)."""

import json
import sys
import time

from e2b import (
    AuthenticationException,
    CommandExitException,
    FileNotFoundException,
    FileType,
    NotFoundException,
    PtySize,
    Sandbox,
)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def commands():
    sbx = Sandbox.create(timeout=300)
    out = {"id": sbx.sandbox_id}
    r = sbx.commands.run("echo hello; echo oops >&2")
    check(r.stdout == "hello\n" and r.stderr == "oops\n" and r.exit_code == 0, f"run: {r}")
    try:
        sbx.commands.run("echo before; exit 3")
        raise AssertionError("a non-zero exit must raise")
    except CommandExitException as e:
        check(e.exit_code == 3 and e.stdout == "before\n", f"exit: {e.exit_code} {e.stdout!r}")
    seen = []
    r = sbx.commands.run(
        "for i in 1 2 3; do echo line$i; sleep 0.2; done",
        on_stdout=lambda s: seen.append((time.monotonic(), s)),
    )
    check("".join(s for _, s in seen) == "line1\nline2\nline3\n", f"callbacks: {seen}")
    # Streamed, not at the end: the first line came well before the last.
    check(seen[-1][0] - seen[0][0] > 0.25, f"callbacks came together: {seen}")
    envs = sbx.commands.run("echo $GREETING", envs={"GREETING": "hi there"}, cwd="/tmp")
    check(envs.stdout == "hi there\n", f"envs: {envs.stdout!r}")
    pwd = sbx.commands.run("pwd", cwd="/tmp")
    check(pwd.stdout == "/tmp\n", f"cwd: {pwd.stdout!r}")
    # A background command, listed, followed again, fed stdin, then killed.
    bg = sbx.commands.run("cat", background=True, stdin=True)
    listed = [p.pid for p in sbx.commands.list()]
    check(bg.pid in listed, f"{bg.pid} not in {listed}")
    sbx.commands.send_stdin(bg.pid, "fed\n")
    sbx.commands.close_stdin(bg.pid)
    done = bg.wait()
    check(done.stdout == "fed\n" and done.exit_code == 0, f"stdin: {done}")
    sleeper = sbx.commands.run("sleep 60", background=True)
    again = sbx.commands.connect(sleeper.pid)
    check(sbx.commands.kill(sleeper.pid) is True, "kill of a running process")
    try:
        again.wait()
        raise AssertionError("a killed command must not end well")
    except CommandExitException as e:
        out["killed_exit"] = e.exit_code
    time.sleep(0.2)
    check(sbx.commands.kill(sleeper.pid) is False, "kill of an ended process")
    try:
        sbx.commands.connect(999999)
        raise AssertionError("connect to an unknown pid")
    except NotFoundException:
        pass
    out["pid"] = bg.pid
    sbx.kill()
    return out


def files():
    sbx = Sandbox.create(timeout=300)
    base = "/tmp/e2b-files"
    info = sbx.files.write(f"{base}/a.txt", "alpha\n")
    check(info.path == f"{base}/a.txt" and info.name == "a.txt", f"write: {info}")
    check(sbx.files.read(f"{base}/a.txt") == "alpha\n", "read")
    data = bytes(range(256)) * 16
    sbx.files.write(f"{base}/bin", data)
    check(sbx.files.read(f"{base}/bin", format="bytes") == data, "binary round trip")
    sbx.files.write_files([
        {"path": f"{base}/m/one", "data": "1"},
        {"path": f"{base}/m/two", "data": "2"},
    ])
    check(sbx.files.read(f"{base}/m/two") == "2", "write_files")
    check(sbx.files.exists(f"{base}/a.txt") is True, "exists")
    check(sbx.files.exists(f"{base}/nope") is False, "exists of a missing path")
    check(sbx.files.make_dir(f"{base}/d/e") is True, "make_dir")
    check(sbx.files.make_dir(f"{base}/d/e") is False, "make_dir of an existing directory")
    moved = sbx.files.rename(f"{base}/a.txt", f"{base}/d/b.txt")
    check(moved.path == f"{base}/d/b.txt", f"rename: {moved}")
    check(sbx.files.exists(f"{base}/a.txt") is False, "renamed away")
    entries = {e.name: e for e in sbx.files.list(base)}
    check(set(entries) == {"bin", "m", "d"}, f"list: {sorted(entries)}")
    check(entries["d"].type == FileType.DIR and entries["bin"].type == FileType.FILE, "types")
    check(entries["bin"].size == len(data), f"size {entries['bin'].size}")
    deep = {e.path for e in sbx.files.list(base, depth=3)}
    check(f"{base}/d/e" in deep and f"{base}/d/b.txt" in deep, f"depth 3: {sorted(deep)}")
    got = sbx.files.get_info(f"{base}/d/b.txt")
    check(got.size == 6 and got.permissions.startswith("-rw"), f"get_info: {got}")
    sbx.files.remove(f"{base}/d/b.txt")
    check(sbx.files.exists(f"{base}/d/b.txt") is False, "remove")
    try:
        sbx.files.read(f"{base}/gone")
        raise AssertionError("read of a missing file")
    except FileNotFoundException:
        pass
    try:
        sbx.files.list(f"{base}/gone")
        raise AssertionError("list of a missing directory")
    except FileNotFoundException:
        pass
    # A watch (the synchronous SDK polls a watcher).
    sbx.files.make_dir(f"{base}/w")
    handle = sbx.files.watch_dir(f"{base}/w")
    sbx.files.write(f"{base}/w/new.txt", "x")
    names = set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "new.txt" not in names:
        for ev in handle.get_new_events():
            names.add(ev.name)
        time.sleep(0.1)
    handle.stop()
    check("new.txt" in names, f"watch events: {names}")
    # `user=` is the account every kind of call acts as: root's closed files stay
    # closed to "user" (read, exists/stat, list, remove), and open to root.
    sbx.commands.run("mkdir -p /root/closed && echo s > /root/closed/f && chmod 700 /root/closed")
    refused = {}
    for name, call in {
        "read": lambda: sbx.files.read("/root/closed/f", user="user"),
        "info": lambda: sbx.files.get_info("/root/closed/f", user="user"),
        "list": lambda: sbx.files.list("/root/closed", user="user"),
        "remove": lambda: sbx.files.remove("/root/closed/f", user="user"),
    }.items():
        try:
            call()
            refused[name] = False
        except Exception:
            refused[name] = True
    check(sbx.files.read("/root/closed/f") == "s\n", "root still reads it (nothing removed)")
    sbx.kill()
    return {"id": sbx.sandbox_id, "watched": sorted(names), "refused_as_user": refused}


def pty():
    sbx = Sandbox.create(timeout=300)
    import threading

    out = bytearray()
    h = sbx.pty.create(PtySize(rows=30, cols=100), timeout=0)
    # The terminal's output, read as it comes (the handle's wait() takes the callback).
    reader = threading.Thread(
        target=lambda: _wait_quietly(h, lambda d: out.extend(d)), daemon=True
    )
    reader.start()
    sbx.pty.send_stdin(h.pid, b"stty size; echo mark-$((40+2))\n")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and b"mark-42" not in out:
        time.sleep(0.05)
    check(b"30 100" in out, f"pty size: {bytes(out)!r}")
    sbx.pty.resize(h.pid, PtySize(rows=40, cols=120))
    sbx.pty.send_stdin(h.pid, b"stty size; echo done-$((1+1))\n")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and b"done-2" not in out:
        time.sleep(0.05)
    check(b"40 120" in out, f"after resize: {bytes(out)!r}")
    check(sbx.pty.kill(h.pid) is True, "pty kill")
    sbx.kill()
    return {"id": sbx.sandbox_id}


def _wait_quietly(handle, on_pty):
    try:
        handle.wait(on_pty=on_pty)
    except Exception:
        # Killed at the end of the scenario: its exit is not what is checked.
        pass


def lifecycle():
    sbx = Sandbox.create(timeout=120, metadata={"suite": "lifecycle"}, envs={"FROM_CREATE": "yes"})
    check(sbx.commands.run("echo $FROM_CREATE").stdout == "yes\n", "create's envs")
    info = sbx.get_info()
    check(info.metadata == {"suite": "lifecycle"} and info.state.value == "running", f"info: {info}")
    before = info.end_at
    sbx.set_timeout(600)
    check(sbx.get_info().end_at > before, "set_timeout moved the end")
    listed = [s.sandbox_id for s in Sandbox.list().next_items()]
    check(sbx.sandbox_id in listed, f"list: {listed}")
    sbx.files.write("/tmp/kept", "kept across the pause")
    check(sbx.pause() is not False, "pause")
    check(Sandbox.get_info(sbx.sandbox_id).state.value == "paused", "paused")
    again = Sandbox.connect(sbx.sandbox_id)
    check(again.get_info().state.value == "running", "connect resumed it")
    check(again.files.read("/tmp/kept") == "kept across the pause", "files kept")
    check(again.is_running() is True, "health")
    check(again.kill() is True, "kill")
    check(again.is_running() is False, "health of a killed sandbox")
    check(Sandbox.kill(sbx.sandbox_id) is False, "kill of a killed sandbox")
    try:
        Sandbox.get_info(sbx.sandbox_id)
        raise AssertionError("get_info of a killed sandbox")
    except Exception as e:
        check("not found" in str(e).lower(), f"get_info after kill: {e}")
    return {"id": sbx.sandbox_id}


def create_only():
    sbx = Sandbox.create(timeout=300)
    sbx.files.write("/root/before", "from the first execution")
    print("TOKEN", json.dumps({"id": sbx.sandbox_id}), flush=True)
    # Wait for the Rust test to move the sandbox to a new execution.
    sys.stdin.readline()
    try:
        sbx.files.read("/root/before")
        raise AssertionError("an old execution's token was served")
    except AuthenticationException as e:
        refused = str(e)
    try:
        sbx.commands.run("true")
        raise AssertionError("an old execution's token ran a command")
    except AuthenticationException:
        pass
    fresh = Sandbox.connect(sbx.sandbox_id)
    check(fresh.files.read("/root/before") == "from the first execution", "files moved")
    check(fresh.commands.run("echo new").stdout == "new\n", "new execution runs")
    fresh.kill()
    return {"refused": refused}


def _get(host, path="/", headers=None):
    """(status, body) of GET `path` at the edge with Host `host` (what a browser sends
    for `http://{host}`; wildcard DNS is not needed for the test)."""
    import os
    import urllib.error
    import urllib.request

    edge = os.environ["E2B_SANDBOX_URL"]
    req = urllib.request.Request(edge + path, headers=dict(headers or {}))
    if host:
        req.add_header("Host", host + ":" + edge.rsplit(":", 1)[1])
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _serve(sbx, port):
    sbx.commands.run(f"mkdir -p /tmp/site && echo served-from-{port} > /tmp/site/hello.txt")
    sbx.commands.run(f"cd /tmp/site && exec python3 -m http.server {port}", background=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            sbx.commands.run(
                f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 1)\"",
                timeout=10,
            )
            return
        except CommandExitException:
            time.sleep(0.2)
    raise AssertionError(f"nothing listens on {port}")


def ports():
    out = {}
    sbx = Sandbox.create(timeout=300)
    check(sbx.traffic_access_token is None, f"a public sandbox has no traffic token: {sbx.traffic_access_token}")
    _serve(sbx, 8000)
    host = sbx.get_host(8000)
    check(host == f"8000-{sbx.sandbox_id}.localhost", f"get_host: {host}")
    out["by_host"] = _get(host, "/hello.txt")
    out["by_headers"] = _get(
        None, "/hello.txt", {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8000"}
    )
    # A port nothing listens on is not served (and the API stays the API).
    out["closed_port"] = _get(sbx.get_host(8001), "/")[0]
    sbx.kill()
    out["after_kill"] = _get(host, "/hello.txt")[0]

    private = Sandbox.create(timeout=300, network={"allow_public_traffic": False})
    token = private.traffic_access_token
    check(isinstance(token, str) and len(token) > 20, f"traffic token: {token}")
    check(
        Sandbox.connect(private.sandbox_id).traffic_access_token == token,
        "connect gives the same traffic token",
    )
    _serve(private, 8080)
    phost = private.get_host(8080)
    out["private_without_token"] = _get(phost, "/hello.txt")[0]
    # Another token: its last character changed (to one it is not).
    wrong = token[:-1] + ("1" if token.endswith("0") else "0")
    out["private_wrong_token"] = _get(phost, "/hello.txt", {"e2b-traffic-access-token": wrong})[0]
    out["private_with_token"] = _get(phost, "/hello.txt", {"e2b-traffic-access-token": token})
    # The other sandbox's token opens nothing here, and this one's nothing there.
    other = Sandbox.create(timeout=300, network={"allow_public_traffic": False})
    _serve(other, 8080)
    out["other_sandboxs_token"] = _get(other.get_host(8080), "/hello.txt", {"e2b-traffic-access-token": token})[0]
    private.kill()
    other.kill()
    return out


def interpreter():
    from e2b_code_interpreter import Sandbox as CodeSandbox

    out = {}
    sbx = CodeSandbox.create(timeout=300)
    info = sbx.get_info()
    out["template"] = info.template_id
    out["metadata"] = info.metadata
    seen = []
    ex = sbx.run_code("x = 41\nprint('hi')\nimport sys; print('oops', file=sys.stderr)\nx + 1", on_stdout=lambda m: seen.append(m.line))
    out["first"] = {"stdout": ex.logs.stdout, "stderr": ex.logs.stderr, "text": ex.text, "error": ex.error is not None, "count": ex.execution_count}
    out["streamed"] = seen
    out["kept"] = sbx.run_code("x").text
    err = sbx.run_code("def f():\n    raise ValueError('bad value')\nf()").error
    out["error"] = {"name": err.name, "value": err.value, "traceback_names_the_cell": "f()" in err.traceback or "line 3" in err.traceback}
    out["env"] = sbx.run_code("import os; os.environ.get('GREETING')", envs={"GREETING": "hello"}).text
    ctx = sbx.create_code_context(cwd="/tmp")
    out["context"] = {
        "cwd": sbx.run_code("import os; os.getcwd()", context=ctx).text,
        "separate": sbx.run_code("'x' in globals()", context=ctx).text,
        "listed": ctx.id in [c.id for c in sbx.list_code_contexts()],
    }
    sbx.run_code("y = 1", context=ctx)
    sbx.restart_code_context(ctx)
    out["context"]["restarted"] = sbx.run_code("'y' in globals()", context=ctx).text
    sbx.remove_code_context(ctx)
    out["context"]["removed"] = ctx.id not in [c.id for c in sbx.list_code_contexts()]
    try:
        sbx.run_code("1", language="r")
        out["other_language"] = "ran"
    except Exception as e:
        out["other_language"] = str(e)
    # A pause keeps the execution, and the interpreter's state with it.
    sbx.pause()
    again = CodeSandbox.connect(sbx.sandbox_id)
    out["after_pause"] = again.run_code("x").text
    # The service gone (as after a resume on another worker): `connect` starts a new one.
    # (`[S]` keeps pkill's own shell from matching.)
    again.commands.run("pkill -f \"[S]PACE's code-interpreter service\"")
    again = CodeSandbox.connect(sbx.sandbox_id)
    out["after_restart"] = again.run_code("'x' in globals(), 6 * 7").text
    again.kill()
    return out


if __name__ == "__main__":
    result = {"commands": commands, "files": files, "pty": pty, "lifecycle": lifecycle, "moved": create_only, "ports": ports, "interpreter": interpreter}[sys.argv[1]]()
    print("RESULT", json.dumps(result), flush=True)
