// The unmodified `e2b` JavaScript SDK against SPACE's E2B front
// (crates/space/tests/e2b.rs): the calls it shares with the Python SDK. Any failed
// check throws; the last line is `RESULT <json>`.
import { Sandbox, CommandExitError, NotFoundError } from 'e2b'

function check(cond, what) {
  if (!cond) throw new Error(what)
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

const sbx = await Sandbox.create({ timeoutMs: 300_000, metadata: { sdk: 'js' } })
const r = await sbx.commands.run('echo hello; echo oops >&2')
check(r.stdout === 'hello\n' && r.stderr === 'oops\n' && r.exitCode === 0, `run: ${JSON.stringify(r)}`)
try {
  await sbx.commands.run('exit 4')
  throw new Error('a non-zero exit must throw')
} catch (e) {
  check(e instanceof CommandExitError && e.exitCode === 4, `exit: ${e}`)
}
const lines = []
await sbx.commands.run('for i in 1 2; do echo l$i; sleep 0.2; done', { onStdout: (d) => lines.push(d) })
check(lines.join('') === 'l1\nl2\n', `callbacks: ${JSON.stringify(lines)}`)
const bg = await sbx.commands.run('sleep 60', { background: true })
check((await sbx.commands.list()).some((p) => p.pid === bg.pid), 'listed')
check((await sbx.commands.kill(bg.pid)) === true, 'kill')

await sbx.files.write('/tmp/js/a.txt', 'alpha')
check((await sbx.files.read('/tmp/js/a.txt')) === 'alpha', 'read')
check((await sbx.files.exists('/tmp/js/a.txt')) === true, 'exists')
check((await sbx.files.exists('/tmp/js/none')) === false, 'exists of a missing path')
check((await sbx.files.makeDir('/tmp/js/d')) === true, 'makeDir')
check((await sbx.files.makeDir('/tmp/js/d')) === false, 'makeDir again')
await sbx.files.rename('/tmp/js/a.txt', '/tmp/js/d/b.txt')
const names = (await sbx.files.list('/tmp/js/d')).map((e) => e.name)
check(names.length === 1 && names[0] === 'b.txt', `list: ${names}`)
await sbx.files.remove('/tmp/js/d/b.txt')
check((await sbx.files.exists('/tmp/js/d/b.txt')) === false, 'remove')

// The watch is a stream here (WatchDir).
const events = []
const watch = await sbx.files.watchDir('/tmp/js/d', (ev) => events.push(ev.name))
await sbx.files.write('/tmp/js/d/new.txt', 'x')
for (let i = 0; i < 100 && !events.includes('new.txt'); i++) await sleep(100)
await watch.stop()
check(events.includes('new.txt'), `watch: ${events}`)

const out = []
const term = await sbx.pty.create({ rows: 25, cols: 90, onData: (d) => out.push(Buffer.from(d).toString()) })
await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size; echo m-$((3*3))\n'))
for (let i = 0; i < 100 && !out.join('').includes('m-9'); i++) await sleep(100)
check(out.join('').includes('25 90'), `pty: ${out.join('')}`)
await sbx.pty.kill(term.pid)

await sbx.setTimeout(600_000)
const listed = (await Sandbox.list().nextItems()).map((s) => s.sandboxId)
check(listed.includes(sbx.sandboxId), `list: ${listed}`)
await sbx.pause()
const again = await Sandbox.connect(sbx.sandboxId)
check((await again.commands.run('echo back')).stdout === 'back\n', 'after connect')
check((await again.kill()) !== false, 'kill')
try {
  await Sandbox.getInfo(sbx.sandboxId)
  throw new Error('getInfo of a killed sandbox')
} catch (e) {
  check(e instanceof NotFoundError || /not found/i.test(String(e)), `after kill: ${e}`)
}
console.log('RESULT ' + JSON.stringify({ id: sbx.sandboxId }))
