// The oldest Node the package claims (package.json `engines`) runs the built proxy: started on
// the built-in simulator, one OpenAI chat stream and one Bedrock event stream (CRC-checked
// frames, zlib.crc32) measured, the metrics exposed. Run it with that Node:
//   npx -y node@20.15.0 .ci/min-node-smoke.mjs [CLI]
// CLI defaults to the checkout's dist/cli.js; .ci/run gives the copy installed from the packed
// tarball, so that what npm would publish is what runs.
// The test suite cannot (vitest 4 needs Node 20.19), so this is what holds the claim.
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';

const engines = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')).engines.node;
// A full version: .ci/run asks npx for node@X.Y.Z, and node@X.Y would be the newest X.Y.z.
const floor = /^>=(\d+\.\d+\.\d+)$/.exec(engines)?.[1];
if (floor === undefined) throw new Error(`engines.node is "${engines}": expected ">=X.Y.Z", the oldest release the smoke runs on`);
const want = `v${floor}`;
if (process.version !== want) throw new Error(`run this with the Node engines names (${want}), not ${process.version}`);

const cli = process.argv[2] ?? 'dist/cli.js';
const child = spawn(process.execPath, [cli, '--port', '0', '--metrics-port', '0'], { stdio: ['ignore', 'pipe', 'inherit'] });
const fail = (message) => {
  child.kill('SIGKILL');
  console.error(`min-node smoke on ${process.version}: ${message}`);
  process.exit(1);
};
const timer = setTimeout(() => fail('no result within 60 s'), 60_000);
const lines = createInterface({ input: child.stdout });
const listening = await new Promise((resolve) => {
  lines.on('line', (l) => {
    let j;
    try {
      j = JSON.parse(l);
    } catch {
      return;
    }
    if (j.level >= 50) fail(`error logged: ${l}`);
    if (j.msg === 'listening') resolve(j);
  });
  child.once('exit', (code) => fail(`proxy exited with ${code} before listening`));
});

const chat = await fetch(`${listening.proxyUrl}/v1/chat/completions`, {
  method: 'POST',
  headers: { 'content-type': 'application/json' },
  body: JSON.stringify({ model: 'demo', stream: true, messages: [{ role: 'user', content: 'hi' }] }),
});
const chatText = await chat.text();
if (chat.status !== 200 || !chatText.includes('data: [DONE]')) fail(`chat stream: ${chat.status} ${chatText.slice(0, 200)}`);

const bedrock = await fetch(`${listening.proxyUrl}/model/demo/converse-stream`, {
  method: 'POST',
  headers: { 'content-type': 'application/json' },
  body: JSON.stringify({ messages: [{ role: 'user', content: [{ text: 'hi' }] }] }),
});
const frames = Buffer.from(await bedrock.arrayBuffer());
if (bedrock.status !== 200 || frames.length < 16) fail(`bedrock stream: ${bedrock.status}, ${frames.length} bytes`);

// Both streams measured: a TTFT count of 2 across the two operations.
let count = 0;
for (let i = 0; i < 50 && count < 2; i++) {
  await new Promise((r) => setTimeout(r, 100));
  const text = await (await fetch(`${listening.metricsUrl}/metrics`)).text();
  count = text
    .split('\n')
    .filter((l) => l.startsWith('gen_ai_client_operation_time_to_first_chunk_seconds_count'))
    .reduce((n, l) => n + Number(l.split(' ').at(-1)), 0);
}
if (count !== 2) fail(`expected 2 measured first tokens in /metrics, found ${count}`);

clearTimeout(timer);
child.removeAllListeners('exit');
child.kill('SIGTERM');
const code = await new Promise((r) => child.once('exit', r));
if (code !== 0) fail(`exit code ${code} after SIGTERM`);
console.log(`min-node smoke on ${process.version}: OpenAI chat and Bedrock streams measured, clean shutdown`);
