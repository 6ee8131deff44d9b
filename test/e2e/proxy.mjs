// A loopback reverse proxy that adds the bearer token: the MCP conformance
// suite tests servers by URL and sends no headers of its own, while
// mcp-exec's HTTP transports refuse any request without the token.
//
// Everything else passes through unchanged and streamed both ways (SSE
// responses, request bodies), in particular the Host and Origin headers as
// received, so that `dns-rebinding-protection` tests the server's own check
// and not this proxy. Hop-by-hop headers are dropped (RFC 9110 §7.6.1).
//
// As a module: startProxy({ target: 'http://127.0.0.1:PORT', token }) →
// { url, port, close() }. As a script (for manual runs):
//   MCP_EXEC_AUTH_TOKEN=... node proxy.mjs http://127.0.0.1:8080
// prints the proxy's base URL and serves until killed.
import http from 'node:http';
import { pathToFileURL } from 'node:url';
import { listenLoopback } from './lib.mjs';

const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-authenticate',
  'proxy-authorization',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
]);

function forwardHeaders(raw, extra = {}) {
  const out = {};
  const connectionTokens = new Set(
    String(raw.connection ?? '')
      .split(',')
      .map((s) => s.trim().toLowerCase())
      .filter(Boolean),
  );
  for (const [k, v] of Object.entries(raw)) {
    const lk = k.toLowerCase();
    if (HOP_BY_HOP.has(lk) || connectionTokens.has(lk)) continue;
    out[lk] = v;
  }
  return { ...out, ...extra };
}

export async function startProxy({ target, token, log = () => {} }) {
  const up = new URL(target);
  const server = http.createServer((req, res) => {
    // Host goes through as the client sent it (node uses a 'host' entry in
    // headers verbatim); only the credential is added, replacing any.
    const headers = forwardHeaders(req.headers, { authorization: `Bearer ${token}` });
    delete headers['x-mcp-auth'];
    const upReq = http.request({
      host: up.hostname,
      port: up.port,
      method: req.method,
      path: req.url,
      headers,
    });
    log(`${req.method} ${req.url} host=${req.headers.host ?? '-'} origin=${req.headers.origin ?? '-'}`);
    upReq.on('response', (upRes) => {
      res.writeHead(upRes.statusCode ?? 502, upRes.statusMessage, forwardHeaders(upRes.headers));
      res.flushHeaders();
      upRes.pipe(res);
      upRes.on('error', () => res.destroy());
    });
    upReq.on('error', (err) => {
      if (!res.headersSent) {
        res.writeHead(502, { 'content-type': 'text/plain' });
        res.end(`proxy: upstream error: ${err.message}\n`);
      } else {
        res.destroy();
      }
    });
    // The client went away: abort the upstream request too, so the server
    // sees its client vanish exactly as it would without the proxy.
    res.on('close', () => {
      if (!res.writableFinished) upReq.destroy();
    });
    req.pipe(upReq);
  });
  const listening = await listenLoopback(server);
  return {
    port: listening.port,
    url: `http://127.0.0.1:${listening.port}`,
    close: listening.close,
  };
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const target = process.argv[2];
  const token = process.env.MCP_EXEC_AUTH_TOKEN;
  if (!target || !token) {
    console.error('usage: MCP_EXEC_AUTH_TOKEN=... node proxy.mjs http://127.0.0.1:PORT');
    process.exit(2);
  }
  const p = await startProxy({ target, token, log: (m) => console.error(`proxy: ${m}`) });
  console.log(p.url);
  const stop = () => p.close().then(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}
