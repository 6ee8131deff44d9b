// A stdio→HTTP bridge, so that the MCP conformance suite (which tests
// servers by URL only) can test the *stdio* server: every streamable-HTTP
// session (the SDK's StreamableHTTPServerTransport) gets its own
// `mcp-exec serve` child on stdio (the SDK's StdioClientTransport, used as a
// raw JSON-RPC pipe), and messages are relayed both ways unchanged.
//
// Only protocol scenarios make sense through it (server-initialize, ping,
// logging-set-level, tools-list): HTTP-level behaviour (SSE streams, Host
// checks) would test this bridge, not mcp-exec.
//
// startBridge({ bin, env }) → { url, close() }; close() ends every child's
// stdin (a clean stdio shutdown) and waits for it.
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { listenLoopback } from './lib.mjs';

import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';

export async function startBridge({ bin, env, stderr = 'ignore' }) {
  const sessions = new Map(); // session id → { http, child }
  const pending = new Set(); // transports not yet initialized

  function newSession() {
    const child = new StdioClientTransport({ command: bin, args: ['serve'], env, stderr });
    const httpT = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (id) => {
        pending.delete(entry);
        sessions.set(id, entry);
      },
    });
    const entry = { http: httpT, child, closed: false };
    pending.add(entry);

    // Relay in order: the child starts on the first message, and later
    // messages queue behind its start.
    let chain = Promise.resolve();
    let started = false;
    httpT.onmessage = (msg) => {
      chain = chain
        .then(async () => {
          if (!started) {
            started = true;
            await child.start();
          }
          await child.send(msg);
        })
        .catch((err) => httpT.onerror?.(err));
    };
    child.onmessage = (msg) => {
      httpT.send(msg).catch(() => {});
    };
    const closeBoth = async () => {
      if (entry.closed) return;
      entry.closed = true;
      pending.delete(entry);
      if (httpT.sessionId) sessions.delete(httpT.sessionId);
      await Promise.allSettled([child.close(), httpT.close()]);
    };
    httpT.onclose = closeBoth;
    child.onclose = closeBoth;
    entry.close = closeBoth;
    return entry;
  }

  const server = http.createServer(async (req, res) => {
    if (!req.url?.startsWith('/mcp')) {
      res.writeHead(404).end();
      return;
    }
    const sid = req.headers['mcp-session-id'];
    let entry;
    if (sid) {
      entry = sessions.get(String(sid));
      if (!entry) {
        res.writeHead(404, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32001, message: 'Session not found' }, id: null }));
        return;
      }
    } else {
      entry = newSession();
    }
    try {
      await entry.http.handleRequest(req, res);
    } catch (err) {
      if (!res.headersSent) res.writeHead(500).end(String(err));
    }
    // A sessionless request that did not initialize one: drop its transport.
    if (!sid && !entry.http.sessionId) await entry.close();
  });
  const listening = await listenLoopback(server);
  return {
    url: `http://127.0.0.1:${listening.port}/mcp`,
    sessionCount: () => sessions.size,
    close: async () => {
      await Promise.allSettled([...sessions.values(), ...pending].map((e) => e.close()));
      await listening.close();
    },
  };
}
