// What a model reads back, with the official TypeScript SDK client over
// streamable HTTP against the built server: unknown arguments refused by
// name, end_session without code, a text block within MCP_EXEC_TEXT_BYTES
// that keeps the end of long output, signals and a session's interrupted
// timeout told as they happened, and large output files as resource links
// that the same client reads back and reuses as files[].uri, and another
// client cannot reach. Run by run.sh: node --test.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { after, before, describe, it } from 'node:test';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

import { startServer } from './lib.mjs';

const CLIENT_INFO = { name: 'mcp-exec-e2e-results', version: '1.0.0' };
const TEXT_BYTES = 4096;

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

async function exec(client, args) {
  const r = await client.callTool({ name: 'exec', arguments: args });
  assert.notEqual(r.isError, true, `isError for ${JSON.stringify(args).slice(0, 200)}: ${textOf(r)}`);
  return r;
}

async function execError(client, args) {
  const r = await client.callTool({ name: 'exec', arguments: args });
  assert.equal(r.isError, true, `want isError for ${JSON.stringify(args)}, got ${textOf(r)}`);
  return textOf(r);
}

describe('what a model reads back (streamable HTTP, two clients)', () => {
  let srv;
  let a;
  let b;
  before(async () => {
    srv = await startServer({ transport: 'http', label: 'results', env: { MCP_EXEC_TEXT_BYTES: String(TEXT_BYTES) } });
    a = await connect(srv);
    b = await connect(srv);
  });
  after(async () => {
    await a?.close();
    await b?.close();
    await srv?.stop();
  });

  it('advertises resources and their URI template', async () => {
    assert.ok(a.getServerCapabilities()?.resources, JSON.stringify(a.getServerCapabilities()));
    const { resourceTemplates } = await a.listResourceTemplates();
    assert.deepEqual(
      resourceTemplates.map((t) => t.uriTemplate),
      ['mcp-exec://outputs/{id}/{+path}'],
    );
  });

  it('an unknown argument is isError naming it and the closest known name; nothing runs', async () => {
    const msg = await execError(a, { code: 'open("/tmp/ran", "w")', timeout: 5 });
    assert.match(msg, /^unknown argument "timeout"; did you mean "timeout_s"\?/);
    const file = await execError(a, { code: '1', files: [{ path: 'x', contents: 'y' }] });
    assert.match(file, /^files\[0\]: unknown field "contents"; did you mean "content"\?/);
  });

  it('end_session needs no code; a call with neither is refused naming code', async () => {
    const s = (await exec(a, { code: 'x = 1', session: 'new' })).structuredContent;
    const end = (await exec(a, { session: s.session, end_session: true })).structuredContent;
    assert.equal(end.session_ended, 'closed');
    assert.match(await execError(a, { stdin: 'x' }), /^code is required/);
  });

  it('keeps the text block within MCP_EXEC_TEXT_BYTES, with the head and tail of 5 MB of output; structuredContent keeps the capped whole', async () => {
    const r = await exec(a, {
      code: "import sys\nfor i in range(50000):\n    sys.stdout.write(f'{i:08d} ' + 'y' * 90 + '\\n')\nprint('the end')\nraise ValueError('boom')",
    });
    const text = textOf(r);
    const bytes = Buffer.byteLength(text);
    assert.ok(bytes <= TEXT_BYTES, `text block of ${bytes} bytes`);
    assert.match(text, /stdout truncated at 1048576 bytes \(5000008 written\)/);
    assert.match(text, /--- stdout ---\n00000000 y+\n/);
    assert.match(text, /\[… \d+ bytes of stdout left out of this text …\]\n/);
    assert.match(text, /ValueError: boom\n$/, 'the traceback ends the text');
    const sc = r.structuredContent;
    assert.equal(Buffer.byteLength(sc.stdout), 1048576, 'the cap, in bytes');
    assert.match(sc.stdout, /^00000000 y+\n/);
    assert.match(sc.stdout, /\n\[… \d+ bytes left out …\]\n/);
    assert.match(sc.stdout, /the end\n$/, 'the tail of the stream is kept');
    assert.equal(sc.stdout_bytes, 5000008);
    console.log(`# 5 MB print: text ${text.length} chars, structuredContent ${JSON.stringify(sc).length} chars`);
  });

  it('names the signal that killed the code, and says a session kept its state after a timeout it stopped for', async () => {
    const seg = await exec(a, { code: 'import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)' });
    assert.equal(seg.structuredContent.signal, 'SIGSEGV');
    assert.match(textOf(seg), /^exit code 139, killed by SIGSEGV \(signal 11\)/);
    const s = (await exec(a, { code: 'x = 41', session: 'new' })).structuredContent.session;
    const t = await exec(a, { code: 'import time\ntime.sleep(60)', session: s, timeout_s: 1 });
    assert.equal(t.structuredContent.timed_out, true);
    assert.equal(t.structuredContent.session_ended, '');
    assert.match(textOf(t), /timed out after 1 s: the code was interrupted \(KeyboardInterrupt\) and stopped; the session and its variables live on/);
    assert.doesNotMatch(textOf(t), /killed/);
    assert.equal((await exec(a, { code: 'x + 1', session: s })).structuredContent.result, '42');
    await exec(a, { session: s, end_session: true });
  });

  it('returns a large output file as a resource_link that resources/read serves and files[].uri reuses; another client reaches none of it', async () => {
    const r = await exec(a, {
      code: "import hashlib, os\ndata = os.urandom(300_000).hex()\nopen('outputs/big.csv', 'w').write(data)\nopen('outputs/small.txt', 'w').write('hi')\nhashlib.sha256(data.encode()).hexdigest()",
    });
    const sc = r.structuredContent;
    const links = r.content.filter((c) => c.type === 'resource_link');
    assert.equal(links.length, 1, JSON.stringify(r.content.map((c) => c.type)));
    const link = links[0];
    assert.equal(link.name, 'big.csv');
    assert.equal(link.size, 600000);
    assert.equal(link.uri, sc.files.find((f) => f.path === 'big.csv').uri);
    assert.ok(r.content.some((c) => c.type === 'resource' && c.resource.text === 'hi'), 'the small file comes inline');
    assert.ok(textOf(r).includes(`big.csv (600000 bytes): resource_link ${link.uri}`), textOf(r));

    const read = await a.readResource({ uri: link.uri });
    assert.equal(`'${createHash('sha256').update(read.contents[0].text).digest('hex')}'`, sc.result);
    const { resources } = await a.listResources();
    assert.ok(resources.some((x) => x.uri === link.uri && x.size === 600000), JSON.stringify(resources));

    const again = await exec(a, {
      code: "import hashlib\nhashlib.sha256(open('data/in.csv', 'rb').read()).hexdigest()",
      files: [{ path: 'data/in.csv', uri: link.uri }],
    });
    assert.equal(again.structuredContent.result, sc.result);

    await assert.rejects(b.readResource({ uri: link.uri }), /Resource not found/);
    assert.match(await execError(b, { code: '1', files: [{ path: 'x', uri: link.uri }] }), /^files\[0\]\.uri: not an output file this client was given/);
    assert.deepEqual((await b.listResources()).resources, []);
  });
});
