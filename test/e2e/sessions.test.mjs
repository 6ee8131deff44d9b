// Persistent sessions end to end: the official TypeScript SDK client over
// streamable HTTP against the built server, on every runtime this host
// has (libcontainer, runsc, process). Run by run.sh: node --test.
//
// Besides what a session keeps and ends on, the suite checks that two
// sessions, and a call without one, do not meet; that the last
// expression comes back as result; that progress messages carry a running
// call's newest output; that a session is frozen between its calls and a
// client holds at most its share; and that a killed server, its sessions
// frozen, leaves nothing behind.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { after, before, describe, it } from 'node:test';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

import { BIN, cgroupDirs, instanceDirs, instanceIds, makeStateDir, pidsInCgroups, serverEnv, sleep, startServer, waitFor } from './lib.mjs';

const CLIENT_INFO = { name: 'mcp-exec-e2e-sessions', version: '1.0.0' };

function textOf(result) {
  return (result.content ?? [])
    .filter((c) => c.type === 'text')
    .map((c) => c.text)
    .join('\n');
}

async function connect(srv) {
  const c = new Client(CLIENT_INFO);
  await c.connect(new StreamableHTTPClientTransport(new URL(srv.url), { requestInit: { headers: { Authorization: `Bearer ${srv.token}` } } }));
  return c;
}

// exec runs a call and returns its structured result, failing on isError.
async function exec(client, args, opts) {
  const r = await client.callTool({ name: 'exec', arguments: args }, undefined, opts);
  assert.notEqual(r.isError, true, `isError for ${JSON.stringify(args)}: ${textOf(r)}`);
  return r.structuredContent;
}

// execError runs a call that must be an isError, and returns its text.
async function execError(client, args) {
  const r = await client.callTool({ name: 'exec', arguments: args });
  assert.equal(r.isError, true, `want isError for ${JSON.stringify(args)}, got ${JSON.stringify(r.structuredContent)}`);
  return textOf(r);
}

// The runtimes to test: libcontainer; under the full matrix
// (MCP_EXEC_TEST_MATRIX=full, the scheduled run) runsc and process too,
// when doctor says this host gives them (CI installs runsc). The runtime
// suite tests sessions on every runtime on every change; this suite tests
// the MCP face, which is the same on each.
function runtimes() {
  const out = ['libcontainer'];
  if (process.env.E2E_MATRIX !== 'full') return out;
  for (const rt of ['runsc', 'process']) {
    const r = spawnSync(BIN, ['doctor'], { env: serverEnv({ MCP_EXEC_RUNTIME: rt, MCP_EXEC_STATE_DIR: makeStateDir(`doctor-${rt}`) }), encoding: 'utf8' });
    if (r.status === 0) out.push(rt);
    else if (process.env.CI === 'true' && rt === 'runsc') throw new Error(`doctor refuses runsc under CI:\n${r.stdout}${r.stderr}`);
  }
  return out;
}

for (const rt of runtimes()) {
  describe(`persistent sessions on ${rt}`, () => {
    let srv;
    let client;
    before(async () => {
      srv = await startServer({ transport: 'http', label: `sessions-${rt}`, env: { MCP_EXEC_RUNTIME: rt, MCP_EXEC_PROGRESS_S: '0.5', MCP_EXEC_MEMORY_MB: '256' } });
      client = await connect(srv);
    });
    after(async () => {
      await client?.close();
      await srv?.stop();
    });

    it('keeps variables, imports, files and the working directory between calls', async () => {
      const a = await exec(client, { code: "import json, os\nx = 41\nos.makedirs('d', exist_ok=True)\nos.chdir('d')\nopen('f.txt', 'w').write('kept')\nx + 1", session: 'new' });
      assert.match(a.session, /^ps_[0-9a-f]{32}$/);
      assert.equal(a.session_ended, '');
      assert.equal(a.result, '42');
      const b = await exec(client, { code: "print(x, json.dumps([1]), os.getcwd().endswith('/d'), open('f.txt').read())", session: a.session });
      assert.equal(b.stdout, '41 [1] True kept\n');
      assert.equal(b.result, '', 'print(...) is None: no result');
      assert.equal(b.session, a.session);
      const c = await exec(client, { code: 'y = 1', session: a.session });
      assert.equal(c.result, '', 'a statement has no result');
      const end = await exec(client, { code: '', session: a.session, end_session: true });
      assert.equal(end.session_ended, 'closed');
      const msg = await execError(client, { code: 'x', session: a.session });
      assert.match(msg, /session/);
      assert.match(msg, /closed/);
    });

    it('two sessions and a call without one do not meet', async () => {
      const a = await exec(client, {
        code: "import os, subprocess, sys\nsecret = 'A'\nopen('a-only.txt', 'w').write('A')\np = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)  # session-A-marker'])\np.pid",
        session: 'new',
      });
      const b = await exec(client, {
        code: [
          'import os, signal',
          "print('secret' in globals(), os.path.exists('a-only.txt'))",
          'seen, listed = False, True',
          'try:',
          "    pids = os.listdir('/proc')",
          'except PermissionError:',
          '    pids, listed = [], False',
          'for p in pids:',
          '    try:',
          "        seen = seen or b'session-A-marker' in open(f'/proc/{p}/cmdline', 'rb').read()",
          '    except (OSError, ValueError):',
          '        pass',
          `pid = ${a.result}`,
          'try:',
          '    os.kill(pid, 0)',
          "    alive = 'signalable'",
          'except ProcessLookupError:',
          "    alive = 'absent'",
          'except PermissionError:',
          "    alive = 'refused'",
          'print(seen, alive, listed)',
        ].join('\n'),
        session: 'new',
      });
      const [vars, procs] = b.stdout.trim().split('\n');
      assert.equal(vars, 'False False', `session B saw A's variable or file: ${b.stdout}${b.stderr}`);
      const [seen, alive, listed] = procs.split(' ');
      // In a pid namespace of its own A's pid is another process's there,
      // if any, so only the listing tells.
      assert.equal(seen, 'False', `session B saw A's process: ${b.stdout}`);
      if (rt === 'process' && listed === 'False') {
        // The process runtime without namespaces shares the machine's pid
        // namespace: its /proc lists nothing, and A's pid is A's process,
        // which it may not signal.
        assert.notEqual(alive, 'signalable', `session B could signal A's process: ${b.stdout}`);
      }
      const fresh = await exec(client, { code: "print('secret' in globals(), __import__('os').path.exists('a-only.txt'))" });
      assert.equal(fresh.stdout, 'False False\n');
      assert.equal(fresh.session, '');
      await exec(client, { code: '', session: a.session, end_session: true });
      await exec(client, { code: '', session: b.session, end_session: true });
    });

    it('a second call to a session waits for the first', async () => {
      const s = await exec(client, { code: 'import time', session: 'new' });
      const first = exec(client, { code: 'time.sleep(2)\nt1 = time.time()', session: s.session });
      await sleep(300);
      const second = await exec(client, { code: 'round(time.time() - t1, 3) >= 0', session: s.session });
      await first;
      assert.equal(second.result, 'True', `the second call ran before the first ended: ${second.stderr}`);
      await exec(client, { code: '', session: s.session, end_session: true });
    });

    it('a timeout interrupts: code that stops keeps its session, code that does not loses it', async () => {
      const s = await exec(client, { code: 'z = 3', session: 'new' });
      const t = await exec(client, { code: 'import time\ntime.sleep(60)', session: s.session, timeout_s: 1 });
      assert.equal(t.timed_out, true);
      assert.equal(t.exit_code, 130);
      assert.equal(t.session_ended, '');
      assert.match(t.stderr, /KeyboardInterrupt/);
      assert.equal((await exec(client, { code: 'z', session: s.session })).result, '3');
      const k = await exec(client, { code: 'import time\nwhile True:\n    try:\n        time.sleep(60)\n    except KeyboardInterrupt:\n        pass', session: s.session, timeout_s: 1 });
      assert.equal(k.timed_out, true);
      assert.equal(k.session_ended, 'timeout');
      assert.match(await execError(client, { code: 'z', session: s.session }), /timeout/);
    });

    it('sys.exit() ends the session', async () => {
      const s = await exec(client, { code: 'pass', session: 'new' });
      const e = await exec(client, { code: 'import sys; sys.exit(5)', session: s.session });
      assert.equal(e.exit_code, 5);
      assert.equal(e.session_ended, 'exited');
    });

    if (rt !== 'process') {
      it('the memory limit ends the session (oom)', async () => {
        const s = await exec(client, { code: 'pass', session: 'new' });
        const o = await exec(client, { code: "x = b'x' * (1 << 30)", session: s.session });
        assert.equal(o.oom_killed, true, JSON.stringify(o));
        assert.equal(o.session_ended, 'oom');
      });
    }

    it('the last expression is the result, without a session too', async () => {
      assert.equal((await exec(client, { code: 'sorted({3, 1, 2})' })).result, '[1, 2, 3]');
      assert.equal((await exec(client, { code: 'None' })).result, '');
      assert.equal((await exec(client, { code: 'x = 1' })).result, '');
    });

    it('progress messages carry the newest output of a running call', async () => {
      const progress = [];
      const r = await exec(
        client,
        { code: "import time\nfor i in range(8):\n    print('line', i)\n    time.sleep(0.4)", session: 'new' },
        { onprogress: (p) => progress.push(p), resetTimeoutOnProgress: true },
      );
      assert.match(r.stdout, /line 7/);
      const early = progress.filter((p) => /stdout: (.*\n)*line [0-6]$/.test(p.message ?? ''));
      assert.ok(early.length > 0, `no progress message carried early output: ${JSON.stringify(progress)}`);
      for (const p of progress) assert.ok((p.message ?? '').length < 600, `a progress message of ${p.message.length} bytes`);
      await exec(client, { code: '', session: r.session, end_session: true });
    });

    it('files with . elements in their paths are accepted', async () => {
      const r = await exec(client, {
        code: "print(open('data.csv').read(), open('folder/sub/x').read())",
        files: [
          { path: './data.csv', content: 'a' },
          { path: 'folder/./sub/x', content: 'b' },
        ],
      });
      assert.equal(r.stdout, 'a b\n');
      assert.match(await execError(client, { code: 'pass', files: [{ path: '../x', content: 'a' }] }), /files\[0\]\.path/);
    });
  });
}

describe('persistent session limits (libcontainer)', () => {
  it('MCP_EXEC_PERSISTENT_MAX bounds them, 0 turns them off; handles are checked', async () => {
    const srv = await startServer({ transport: 'http', label: 'sessions-max', env: { MCP_EXEC_PERSISTENT_MAX: '1' } });
    const client = await connect(srv);
    try {
      const s = await exec(client, { code: 'pass', session: 'new' });
      assert.match(await execError(client, { code: 'pass', session: 'new' }), /MCP_EXEC_PERSISTENT_MAX=1/);
      assert.match(await execError(client, { code: 'pass', session: 'ps_nope' }), /session/);
      assert.match(await execError(client, { code: 'pass', session: `ps_${'0'.repeat(32)}` }), /no persistent session/);
      await exec(client, { code: '', session: s.session, end_session: true });
      await exec(client, { code: 'pass', session: 'new' });
    } finally {
      await client.close();
      await srv.stop();
    }
    const off = await startServer({ transport: 'http', label: 'sessions-off', env: { MCP_EXEC_PERSISTENT_MAX: '0' } });
    const c2 = await connect(off);
    try {
      assert.match(await execError(c2, { code: 'pass', session: 'new' }), /MCP_EXEC_PERSISTENT_MAX=0/);
    } finally {
      await c2.close();
      await off.stop();
    }
  });

  it('an idle session and one past its lifetime end', async () => {
    const srv = await startServer({ transport: 'http', label: 'sessions-idle', env: { MCP_EXEC_PERSISTENT_IDLE_S: '1', MCP_EXEC_PERSISTENT_LIFETIME_S: '3' } });
    const client = await connect(srv);
    try {
      const idle = await exec(client, { code: 'pass', session: 'new' });
      await sleep(1800);
      assert.match(await execError(client, { code: 'pass', session: idle.session }), /idle/);
      const s = await exec(client, { code: 'pass', session: 'new' });
      let msg = '';
      const ended = await waitFor(
        async () => {
          const r = await client.callTool({ name: 'exec', arguments: { code: 'pass', session: s.session } });
          msg = textOf(r);
          return r.isError === true;
        },
        { timeoutMs: 10_000, intervalMs: 300 },
      );
      assert.ok(ended, 'the session outlived its lifetime');
      assert.match(msg, /lifetime/);
    } finally {
      await client.close();
      await srv.stop();
    }
  });

  it('a session is frozen between calls; a client holds at most half the sessions', async () => {
    const srv = await startServer({ transport: 'http', label: 'sessions-frozen' });
    const a = await connect(srv);
    const b = await connect(srv);
    try {
      // A thread that counts, and its own CPU clock: it counts only while
      // a call runs.
      const s = await exec(a, {
        code: 'import threading, time\nn = 0\ndef count():\n    global n\n    while True:\n        n += 1\nt = threading.Thread(target=count, daemon=True)\nt.start()\nclock = time.pthread_getcpuclockid(t.ident)\ntime.sleep(0.2)\nat_end = time.clock_gettime(clock)',
        session: 'new',
      });
      await sleep(1500);
      const gap = await exec(a, { code: 'round(time.clock_gettime(clock) - at_end, 3)', session: s.session });
      assert.ok(Number(gap.result) < 0.5, `the counting thread ran ${gap.result} s of CPU in the 1.5 s between two calls`);
      // Three more of a's own (4 of the 8), then a's fifth is refused,
      // naming the variable, while b still gets one.
      for (let i = 0; i < 3; i++) await exec(a, { code: 'pass', session: 'new' });
      assert.match(await execError(a, { code: 'pass', session: 'new' }), /MCP_EXEC_PERSISTENT_PER_CLIENT=4/);
      const other = await exec(b, { code: 'pass', session: 'new' });
      assert.match(other.session, /^ps_/);
    } finally {
      await a.close();
      await b.close();
      await srv.stop();
    }
  });

  it('a killed server leaves no session behind', async () => {
    const srv = await startServer({ transport: 'http', label: 'sessions-kill' });
    const client = await connect(srv);
    await exec(client, { code: "import subprocess\np = subprocess.Popen(['sleep', '600'])", session: 'new' });
    await exec(client, { code: 'x = 1', session: 'new' });
    const ids = instanceIds(srv.stateDir);
    assert.ok(pidsInCgroups(ids).length > 0, 'the sessions hold no process');
    srv.child.kill('SIGKILL');
    await srv.exited;
    const gone = await waitFor(() => pidsInCgroups(ids).length === 0 && instanceDirs(srv.stateDir).length === 0 && ids.every((id) => cgroupDirs(id).length === 0), { timeoutMs: 10_000 });
    assert.ok(gone, `after the server was killed: processes ${pidsInCgroups(ids)}, instance dirs ${instanceDirs(srv.stateDir)}`);
    await client.close().catch(() => {});
    await srv.stop();
  });
});
