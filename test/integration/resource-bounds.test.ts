import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import net, { type AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { hist, scrape, total } from '../helpers/prom.js';
import { spawnCli, type Spawned } from '../helpers/process.js';

// What a hostile or broken upstream's answer costs the proxy's memory: the peak RSS of a real
// proxy process (VmHWM, so the smaller case runs first), against bounds far from both the fixed cost (~10-30 MB) and what these
// answers cost before (+500 MB and +250 MB).

const JSON_CONTENT = 'a'.repeat(4_000_000);
const JSON_BODY = Buffer.from(JSON.stringify({ id: 'c', object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: JSON_CONTENT } }], usage: { prompt_tokens: 3, completion_tokens: 7, total_tokens: 10 } }));
const SSE_BODY = Buffer.from(
  'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n' +
    'data:\n'.repeat(1_000_000) + // one event of a million empty data lines (6 MB, under the 1 MiB data cap)
    '\n' +
    'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\n\ndata: [DONE]\n\n',
);

/** An upstream that answers each path with one of the bodies above, written at once. */
function answer(path: string): Buffer {
  if (path.startsWith('/json')) {
    // One HTTP chunk per byte: 24 MB on the wire for a 4 MB body (under maxBodyBytes, 4 MiB).
    const wire = Buffer.allocUnsafe(JSON_BODY.length * 6);
    for (let i = 0; i < JSON_BODY.length; i++) {
      const o = i * 6;
      wire[o] = 0x31; // "1"
      wire[o + 1] = 0x0d;
      wire[o + 2] = 0x0a;
      wire[o + 3] = JSON_BODY[i]!;
      wire[o + 4] = 0x0d;
      wire[o + 5] = 0x0a;
    }
    return Buffer.concat([Buffer.from('HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n'), wire, Buffer.from('0\r\n\r\n')]);
  }
  return Buffer.concat([Buffer.from(`HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: ${SSE_BODY.length}\r\n\r\n`), SSE_BODY]);
}

const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
const peakRssMb = (pid: number) => Number(/VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]) / 1024;

let up: net.Server;
let proxy: Spawned;
let proxyUrl: string;
let metricsUrl: string;

beforeAll(async () => {
  up = net.createServer((s) => {
    let head = '';
    s.on('data', (d: Buffer) => {
      head += d.toString('latin1');
      const end = head.indexOf('\r\n\r\n');
      if (end === -1) return;
      const len = Number(/content-length: *(\d+)/i.exec(head.slice(0, end))?.[1] ?? 0);
      if (head.length < end + 4 + len) return;
      const path = head.split(' ')[1]!;
      head = head.slice(end + 4 + len);
      s.write(answer(path));
    });
    s.on('error', () => {});
  });
  await new Promise<void>((r) => up.listen(0, '127.0.0.1', r));
  proxy = spawnCli(['--upstream', `http://127.0.0.1:${(up.address() as AddressInfo).port}`, '--port', '0', '--metrics-port', '0']);
  const l = await proxy.waitFor((x) => x.msg === 'listening');
  proxyUrl = l.proxyUrl as string;
  metricsUrl = l.metricsUrl as string;
});

afterAll(async () => {
  await proxy?.stop();
  await new Promise((r) => up.close(r));
});

/** Posts through the proxy: the body the client got, the growth of the proxy's peak RSS (MB), and the output tokens it recorded. */
async function through(path: string, model: string): Promise<{ body: Buffer; growth: number; outputTokens: number }> {
  const before = peakRssMb(proxy.child.pid!);
  const r = await fetch(`${proxyUrl}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model, stream: path.startsWith('/sse') }) });
  const body = Buffer.from(await r.arrayBuffer());
  const growth = peakRssMb(proxy.child.pid!) - before;
  let samples = await scrape(metricsUrl);
  for (let i = 0; i < 50 && total(samples, 'llm_proxy_streams_total', { gen_ai_request_model: model }) === 0; i++) samples = await scrape(metricsUrl);
  return { body, growth, outputTokens: hist(samples, 'gen_ai_client_token_usage', { gen_ai_request_model: model, gen_ai_token_type: 'output' }).sum };
}

describe('memory bounds against hostile upstream answers', () => {
  it('an SSE event of a million short data lines is held as one buffer: forwarded intact, memory bounded, later events still measured', async () => {
    const r = await through('/sse/v1/chat/completions', 'm-sse');
    expect(sha(r.body)).toBe(sha(SSE_BODY));
    expect(r.growth).toBeLessThan(120);
    expect(r.outputTokens).toBe(2);
  });

  it('a non-streamed JSON answer in 1-byte HTTP chunks is kept as one buffer: measured, forwarded intact, memory bounded', async () => {
    const r = await through('/json/v1/chat/completions', 'm-json');
    expect(sha(r.body)).toBe(sha(JSON_BODY));
    expect(r.growth).toBeLessThan(200);
    expect(r.outputTokens).toBe(7); // read from the kept body: the usage at its end
  });
});
