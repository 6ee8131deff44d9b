// Runs the official MCP conformance suite (@modelcontextprotocol/conformance,
// pinned in package.json) against the built mcp-exec:
//   - over streamable HTTP, through proxy.mjs (adds the bearer token, passes
//     Host/Origin through): the scenarios that apply to a tools-only server
//     plus the HTTP ones;
//   - over stdio, through bridge.mjs (one `mcp-exec serve` child per
//     session): the protocol scenarios.
// A scenario passes when the CLI exits 0 and its checks.json holds at least
// one SUCCESS and no FAILURE or WARNING.
// Needs Node >= 22 (the suite's requirement); run.sh runs it with the Node
// from node_modules. Exit status: 0 when every scenario passed.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { startBridge } from './bridge.mjs';
import { BIN, instanceDirs, makeStateDir, sandboxPids, serverEnv, startServer, sweepState, waitFor } from './lib.mjs';
import { startProxy } from './proxy.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const CLI = path.join(here, 'node_modules', '@modelcontextprotocol', 'conformance', 'dist', 'index.js');

const PROTOCOL_SCENARIOS = ['server-initialize', 'ping', 'logging-set-level', 'tools-list'];
const HTTP_SCENARIOS = [...PROTOCOL_SCENARIOS, 'server-sse-multiple-streams', 'dns-rebinding-protection'];
const SCENARIO_TIMEOUT_MS = 60_000;

const major = Number(process.versions.node.split('.')[0]);
if (major < 22) {
  console.error(`conformance: needs Node >= 22, this is ${process.version} (${process.execPath})`);
  process.exit(2);
}

const outRoot = fs.mkdtempSync(path.join(process.env.E2E_TMP ?? os.tmpdir(), 'conformance-'));

function runCli(args) {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [CLI, ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, NO_COLOR: '1' },
    });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (out += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), SCENARIO_TIMEOUT_MS);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, out });
    });
  });
}

async function runScenario(label, url, scenario) {
  const dir = path.join(outRoot, `${label}-${scenario}`);
  fs.mkdirSync(dir, { recursive: true });
  const t0 = Date.now();
  const { code, signal, out } = await runCli(['server', '--url', url, '--scenario', scenario, '-o', dir]);
  const ms = Date.now() - t0;
  let checks = [];
  let readErr = '';
  try {
    const sub = fs.readdirSync(dir).find((d) => fs.existsSync(path.join(dir, d, 'checks.json')));
    checks = JSON.parse(fs.readFileSync(path.join(dir, sub, 'checks.json'), 'utf8'));
  } catch (err) {
    readErr = `no checks.json: ${err.message}`;
  }
  const count = (s) => checks.filter((c) => c.status === s).length;
  const r = {
    label,
    scenario,
    code,
    signal,
    ms,
    success: count('SUCCESS'),
    failure: count('FAILURE'),
    warning: count('WARNING'),
    out,
    checks,
    readErr,
  };
  r.pass = code === 0 && !readErr && r.success > 0 && r.failure === 0 && r.warning === 0;
  const mark = r.pass ? 'PASS' : 'FAIL';
  console.log(
    `${mark} ${label.padEnd(5)} ${scenario.padEnd(28)} ${r.success} ok, ${r.failure} failed, ${r.warning} warnings (${ms} ms)`,
  );
  if (!r.pass) {
    for (const c of checks.filter((c) => c.status === 'FAILURE' || c.status === 'WARNING')) {
      console.log(`       ${c.status} ${c.name}: ${c.errorMessage ?? c.description}`);
      if (c.details) console.log(`         details: ${JSON.stringify(c.details).slice(0, 600)}`);
    }
    if (readErr || code !== 0) {
      console.log(`       CLI exit ${code}${signal ? ` (${signal})` : ''} ${readErr}\n` + out.replace(/^/gm, '       | '));
    }
  }
  return r;
}

const results = [];
const problems = [];
let srv;
let proxy;
let bridge;
let bridgeState;
let cleaning;
const cleanup = () =>
  (cleaning ??= (async () => {
    await proxy?.close();
    await bridge?.close();
    if (srv) {
      const { code, signal } = await srv.stop();
      if (code !== 0) problems.push(`the HTTP server exited with ${code ?? signal} on SIGTERM`);
    }
    if (bridgeState) sweepState(bridgeState);
  })());
process.on('SIGTERM', () => cleanup().finally(() => process.exit(143)));
process.on('SIGINT', () => cleanup().finally(() => process.exit(130)));

try {
  // Streamable HTTP, through the token-adding proxy.
  srv = await startServer({ transport: 'http', label: 'conformance-http' });
  proxy = await startProxy({ target: srv.baseURL, token: srv.token });
  for (const s of HTTP_SCENARIOS) results.push(await runScenario('http', `${proxy.url}/mcp`, s));
  if (sandboxPids(srv.stateDir).length) problems.push('sandbox processes left after the HTTP scenarios');

  // Stdio, through the bridge.
  bridgeState = makeStateDir('conformance-stdio');
  bridge = await startBridge({ bin: BIN, env: serverEnv({ MCP_EXEC_STATE_DIR: bridgeState }) });
  for (const s of PROTOCOL_SCENARIOS) results.push(await runScenario('stdio', bridge.url, s));
  await bridge.close();
  bridge = undefined;
  // A server the bridge had to kill (a slow shutdown on a busy machine)
  // leaves its instance to its watchdog, which removes it soon after.
  await waitFor(() => instanceDirs(bridgeState).length === 0, { timeoutMs: 30000 });
  if (instanceDirs(bridgeState).length) {
    problems.push(`stdio servers left instance dirs in ${bridgeState}: ${instanceDirs(bridgeState).join(', ')}`);
  }
} catch (err) {
  problems.push(`conformance run aborted: ${err.stack ?? err}`);
} finally {
  await cleanup();
  if (!process.env.E2E_KEEP) fs.rmSync(outRoot, { recursive: true, force: true });
}

const passed = results.filter((r) => r.pass);
for (const p of problems) console.log(`FAIL ${p}`);
const ok = problems.length === 0 && passed.length === results.length && results.length === HTTP_SCENARIOS.length + PROTOCOL_SCENARIOS.length;
console.log(
  `conformance: ${passed.length}/${results.length} scenarios passed ` +
    `(http: ${passed.filter((r) => r.label === 'http').map((r) => r.scenario).join(', ') || 'none'}; ` +
    `stdio: ${passed.filter((r) => r.label === 'stdio').map((r) => r.scenario).join(', ') || 'none'})`,
);
process.exit(ok ? 0 : 1);
