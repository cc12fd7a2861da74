import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, expect, it, vi } from 'vitest';
import type { RunningProxy } from '../../src/main.js';
import { hist, scrape, total } from '../helpers/prom.js';
import { startTestProxy } from '../helpers/proxy.js';

// The proxy sets up a request's measurement after the loop iteration's I/O callbacks
// (afterIo). Held here until the response head and first events went through, the
// set-up must then happen where they need it, and measure the whole stream.
const hold = vi.hoisted(() => ({ on: false, jobs: [] as (() => void)[] }));
vi.mock('../../src/measure/after-io.js', async (importOriginal) => {
  const real = await importOriginal<typeof import('../../src/measure/after-io.js')>();
  return { ...real, afterIo: (fn: () => void) => (hold.on ? void hold.jobs.push(fn) : real.afterIo(fn)) };
});

let proxy: RunningProxy | undefined;
let upstream: http.Server | undefined;
afterEach(async () => {
  hold.on = false;
  await proxy?.close();
  upstream?.closeAllConnections();
  await new Promise<void>((r) => (upstream ? upstream.close(() => r()) : r()));
});

const event = (k: number) => `data: {"id":"c","choices":[{"index":0,"delta":{"content":"t${k}"}}]}\n\n`;

it('a response that arrives before the deferred measurement set-up is measured whole, with the model from the body', async () => {
  let more!: () => void;
  const goOn = new Promise<void>((r) => (more = r));
  upstream = http.createServer((req, res) => {
    req.resume();
    req.on('end', async () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(event(1) + event(2));
      await goOn;
      for (let k = 3; k <= 5; k++) {
        res.write(event(k));
        await sleep(5);
      }
      res.end('data: [DONE]\n\n');
    });
  });
  await new Promise<void>((r) => upstream!.listen(0, '127.0.0.1', r));
  proxy = await startTestProxy(`http://127.0.0.1:${(upstream.address() as AddressInfo).port}`);

  hold.on = true;
  const body = await new Promise<string>((resolve, reject) => {
    const req = http.request(`${proxy!.proxyUrl}/v1/chat/completions`, { method: 'POST', agent: false, headers: { 'content-type': 'application/json' } }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => {
        if (text === '') {
          // The head and the first events were forwarded while the set-up was still held.
          const jobs = hold.jobs.splice(0);
          hold.on = false;
          expect(jobs.length).toBeGreaterThan(0);
          for (const j of jobs) j();
          more();
        }
        text += d;
      });
      res.on('end', () => resolve(text));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end('{"model":"m-body","stream":true}');
  });
  expect(body).toBe([1, 2, 3, 4, 5].map(event).join('') + 'data: [DONE]\n\n');

  await sleep(50); // the request's records run after its end
  const samples = await scrape(proxy.metricsUrl);
  expect(hist(samples, 'gen_ai_client_operation_time_to_first_chunk_seconds', { gen_ai_request_model: 'm-body' }).count).toBe(1);
  expect(hist(samples, 'gen_ai_client_operation_time_per_output_chunk_seconds', { gen_ai_request_model: 'm-body' }).count).toBe(4);
  expect(hist(samples, 'gen_ai_client_operation_duration_seconds', { gen_ai_request_model: 'm-body' }).count).toBe(1);
  expect(total(samples, 'llm_proxy_streams_active')).toBe(0); // set up once: one +1, one -1
});
