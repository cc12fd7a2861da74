import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

/** A self-signed certificate for localhost in a temp dir: paths, and `remove` for the cleanup. */
export function selfSignedCert(subjectAltName = 'DNS:localhost'): { key: string; cert: string; remove: () => Promise<void> } {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llp-tls-'));
  const key = path.join(dir, 'key.pem');
  const cert = path.join(dir, 'cert.pem');
  execFileSync('openssl', [
    'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '2',
    '-subj', '/CN=localhost', '-addext', `subjectAltName=${subjectAltName}`, '-keyout', key, '-out', cert,
  ], { stdio: 'ignore' });
  return { key, cert, remove: async () => fs.rmSync(dir, { recursive: true, force: true }) };
}
