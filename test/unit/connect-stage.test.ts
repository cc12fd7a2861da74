// The connect timeout's detail: how far a connection got, at every stage, direct and through an egress proxy.
import { EventEmitter } from 'node:events';
import type net from 'node:net';
import { describe, expect, it } from 'vitest';
import { ConnectStage } from '../../src/proxy/connect-stage.js';
import { parseProxyUrl } from '../../src/proxy/egress.js';

/** A socket's connect events, in order, with the detail a timeout would read before each and after the last. */
function details(make: (socket: net.Socket) => ConnectStage, events: string[], after?: (stage: ConnectStage) => void): Array<string | undefined> {
  const socket = new EventEmitter() as unknown as net.Socket;
  const stage = make(socket);
  const seen = [stage.detail()];
  for (const e of events) {
    socket.emit(e);
    seen.push(stage.detail());
  }
  if (after !== undefined) {
    after(stage);
    seen.push(stage.detail());
  }
  return seen;
}

describe('ConnectStage', () => {
  it('direct: the lookup, then the TCP connection, then TLS; nothing once the handshake is done', () => {
    expect(details((s) => new ConnectStage(s, 'api.example.test', undefined, undefined, true), ['lookup', 'connect', 'secureConnect'])).toEqual([
      'the name lookup of api.example.test did not finish',
      'the upstream did not accept the connection',
      'the TLS handshake with the upstream did not finish',
      undefined,
    ]);
    // An IP: no lookup (a plain-HTTP connection is up at its TCP connect).
    expect(details((s) => new ConnectStage(s, '127.0.0.1', undefined, undefined, false), [])).toEqual(['the upstream did not accept the connection']);
  });

  it('through an egress proxy: its lookup, its connection, its answer to CONNECT, then TLS with the upstream inside the tunnel; every stage names the proxy', () => {
    const via = parseProxyUrl('http://proxy.example.test:3128');
    const through = `through egress proxy ${via.display}`;
    expect(details((s) => new ConnectStage(s, via.host, via, 'api.example.test:443', true), ['lookup', 'connect'], (st) => st.tunnelOpened(true))).toEqual([
      `the name lookup of proxy.example.test did not finish; ${through}`,
      `the egress proxy did not accept the connection; ${through}`,
      `the egress proxy did not answer CONNECT api.example.test:443; ${through}`,
      `the TLS handshake with the upstream did not finish; ${through}`,
    ]);
    // An https proxy: TLS with the proxy before CONNECT is asked.
    const tlsVia = parseProxyUrl('https://proxy.example.test');
    expect(details((s) => new ConnectStage(s, tlsVia.host, tlsVia, 'api.example.test:443', false), ['lookup', 'connect', 'secureConnect'], (st) => st.tunnelOpened(false))).toEqual([
      `the name lookup of proxy.example.test did not finish; through egress proxy ${tlsVia.display}`,
      `the egress proxy did not accept the connection; through egress proxy ${tlsVia.display}`,
      `the TLS handshake with the egress proxy did not finish; through egress proxy ${tlsVia.display}`,
      `the egress proxy did not answer CONNECT api.example.test:443; through egress proxy ${tlsVia.display}`,
      `through egress proxy ${tlsVia.display}`,
    ]);
  });
});
