// Helpers shared by the end-to-end tests and the conformance runner: start
// the built mcp-exec binary on a private state dir, wait for it, find what
// its sandboxes left running on the host, and tear everything down.
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));

// The binary under test: E2E_BIN (run.sh sets it) or ../../bin/mcp-exec.
export const BIN = path.resolve(process.env.E2E_BIN ?? path.join(here, '..', '..', 'bin', 'mcp-exec'));

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A fresh private state dir (the server wants 0700) under the run's scratch
// dir, so run.sh's trap removes whatever a test left behind.
export function makeStateDir(label = 'state') {
  const base = process.env.E2E_TMP ?? os.tmpdir();
  return fs.mkdtempSync(path.join(base, `mcp-exec-${label}-`));
}

export function newToken() {
  return randomBytes(24).toString('hex');
}

// A loopback port nobody listens on right now (the server binds it shortly
// after; a collision only makes startServer retry).
export async function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

// The environment a server gets: ours, minus anything MCP_EXEC_* the caller
// may have exported (tests must not depend on the operator's settings), plus
// the given overrides. No pool: the tests check that a call's sandbox is
// gone by finding none of the instance's, and a pool keeps prepared ones
// (the Go tests cover the pool: TestBinaryPool, the pooled property suite).
export function serverEnv(extra = {}) {
  const env = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (!k.startsWith('MCP_EXEC_')) env[k] = v;
  }
  return { ...env, MCP_EXEC_POOL_SIZE: '0', ...extra };
}

// startServer runs `mcp-exec serve --transport http|sse` on a free loopback
// port with a fresh token and state dir, and resolves once /readyz says it
// is ready (/healthz answers from the moment the port is bound, before the
// sandbox is up).
// Its stderr is kept (last 64 KiB) for failure messages.
export async function startServer({ transport = 'http', env = {}, label = transport } = {}) {
  const token = newToken();
  const stateDir = makeStateDir(label);
  let lastErr;
  for (let attempt = 0; attempt < 3; attempt++) {
    const port = await freePort();
    const addr = `127.0.0.1:${port}`;
    const child = spawn(BIN, ['serve', '--transport', transport, '--addr', addr], {
      env: serverEnv({ MCP_EXEC_AUTH_TOKEN: token, MCP_EXEC_STATE_DIR: stateDir, ...env }),
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    const srv = new Server(child, { transport, addr, port, token, stateDir });
    try {
      await srv.waitReady(90_000);
      return srv;
    } catch (err) {
      lastErr = err;
      await srv.stop();
      if (!/address already in use/i.test(srv.stderr)) break;
    }
  }
  fs.rmSync(stateDir, { recursive: true, force: true });
  throw lastErr;
}

export class Server {
  constructor(child, { transport, addr, port, token, stateDir }) {
    Object.assign(this, { child, transport, addr, port, token, stateDir });
    this.stderr = '';
    this.exited = new Promise((resolve) => {
      child.on('exit', (code, signal) => {
        this.exitCode = code;
        this.exitSignal = signal;
        resolve({ code, signal });
      });
    });
    child.stderr.on('data', (d) => {
      this.stderr = (this.stderr + d.toString()).slice(-65536);
      if (process.env.E2E_VERBOSE) process.stderr.write(`[${transport} server] ${d}`);
    });
  }

  get baseURL() {
    return `http://${this.addr}`;
  }

  get url() {
    return `${this.baseURL}${this.transport === 'sse' ? '/sse' : '/mcp'}`;
  }

  async waitReady(timeoutMs) {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (this.exitCode !== undefined || this.exitSignal) {
        throw new Error(`mcp-exec serve exited (code ${this.exitCode}, signal ${this.exitSignal}) before listening:\n${this.stderr}`);
      }
      try {
        const res = await fetch(`${this.baseURL}/readyz`, { signal: AbortSignal.timeout(2000) });
        await res.body?.cancel();
        if (res.status === 200) return;
      } catch {
        // not listening yet
      }
      await sleep(100);
    }
    throw new Error(`mcp-exec serve was not ready (/readyz) within ${timeoutMs} ms:\n${this.stderr}`);
  }

  // stop sends SIGTERM (graceful shutdown), escalating to SIGKILL, then
  // removes the state dir. It resolves with the exit status.
  async stop({ removeState = true, graceMs = 10_000 } = {}) {
    if (this.exitCode === undefined && !this.exitSignal) {
      this.child.kill('SIGTERM');
      const t = setTimeout(() => this.child.kill('SIGKILL'), graceMs);
      await this.exited;
      clearTimeout(t);
    }
    if (removeState) sweepState(this.stateDir);
    return { code: this.exitCode, signal: this.exitSignal };
  }
}

// sweepState removes what dead servers left in stateDir (their containers,
// cgroups and instance dirs) the way the product does it: a new server on the
// same state dir sweeps dead instances when it starts; on stdin EOF it exits
// at once. Then the state dir itself goes.
export function sweepState(stateDir) {
  if (instanceDirs(stateDir).length > 0) {
    spawnSync(BIN, ['serve'], {
      env: serverEnv({ MCP_EXEC_STATE_DIR: stateDir }),
      stdio: ['ignore', 'ignore', 'ignore'],
      timeout: 30_000,
    });
  }
  fs.rmSync(stateDir, { recursive: true, force: true });
}

// The instance dirs a server created in its state dir (one per live server).
export function instanceDirs(stateDir) {
  let names = [];
  try {
    names = fs.readdirSync(stateDir, { withFileTypes: true });
  } catch {
    return [];
  }
  return names.filter((d) => d.isDirectory()).map((d) => path.join(stateDir, d.name));
}

// bundles lists the call bundles present in every instance dir of stateDir.
export function bundles(stateDir) {
  const out = [];
  for (const inst of instanceDirs(stateDir)) {
    try {
      for (const b of fs.readdirSync(path.join(inst, 'bundles'))) out.push(path.join(inst, 'bundles', b));
    } catch {
      // gone
    }
  }
  return out;
}

// instanceIds names the live server instances of a state dir (each keeps
// its state in <stateDir>/<instance-id>/ and its cgroups under
// mcp-exec/<instance-id>/).
export function instanceIds(stateDir) {
  return instanceDirs(stateDir).map((d) => path.basename(d));
}

// pidsInCgroups lists host processes that live in a cgroup of one of the
// given server instances: /proc/PID/cgroup contains "mcp-exec/<id>/" (the
// runtime's cgroup layout, v1 and v2 alike). Zombies do not count.
export function pidsInCgroups(ids) {
  if (ids.length === 0) return [];
  const needles = ids.map((id) => `mcp-exec/${id}/`);
  const pids = [];
  for (const ent of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(ent)) continue;
    let cg;
    try {
      cg = fs.readFileSync(`/proc/${ent}/cgroup`, 'utf8');
    } catch {
      continue; // exited meanwhile
    }
    if (!needles.some((n) => cg.includes(n))) continue;
    // A zombie is dead already (its parent reaps it soon); not a runner.
    try {
      const stat = fs.readFileSync(`/proc/${ent}/stat`, 'utf8');
      if (stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z')) continue;
    } catch {
      continue;
    }
    pids.push(Number(ent));
  }
  return pids;
}

// cgroupDirs lists the cgroup directories left for a server instance: under
// every v1 controller (/sys/fs/cgroup/<ctrl>/mcp-exec/<id>) and the v2
// hierarchy (/sys/fs/cgroup[/unified]/mcp-exec/<id>).
export function cgroupDirs(id) {
  const roots = ['/sys/fs/cgroup'];
  try {
    for (const d of fs.readdirSync('/sys/fs/cgroup', { withFileTypes: true })) {
      if (d.isDirectory()) roots.push(path.join('/sys/fs/cgroup', d.name));
    }
  } catch {
    return [];
  }
  return roots.map((r) => path.join(r, 'mcp-exec', id)).filter((d) => fs.existsSync(d));
}

// sandboxPids: the host processes of the sandboxes a state dir's live
// server instances run.
export function sandboxPids(stateDir) {
  return pidsInCgroups(instanceIds(stateDir));
}

// cmdline of a pid, for messages.
export function cmdline(pid) {
  try {
    return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ').trim();
  } catch {
    return '(gone)';
  }
}

// waitFor polls fn until it returns a truthy value or the time is up; it
// returns the last value.
export async function waitFor(fn, { timeoutMs = 5000, intervalMs = 50 } = {}) {
  const deadline = Date.now() + timeoutMs;
  let v = await fn();
  while (!v && Date.now() < deadline) {
    await sleep(intervalMs);
    v = await fn();
  }
  return v;
}

// listenLoopback starts server on a free loopback port and tracks its
// sockets, so that close() ends open streams (SSE) instead of waiting for
// them.
export async function listenLoopback(server) {
  const sockets = new Set();
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', resolve);
  });
  return {
    port: server.address().port,
    close: () =>
      new Promise((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
