import net from 'node:net';
import type { EgressProxy } from './egress.js';

/**
 * How far a connection to an upstream got, for the connect timeout's message: the name lookup,
 * the TCP connect (and TLS with an https egress proxy), the proxy's answer to CONNECT, the TLS
 * handshake with the upstream. `socket` is the first hop's: the upstream's, or the proxy's.
 */
export class ConnectStage {
  private stage: string | undefined;

  constructor(
    socket: net.Socket,
    host: string,
    private readonly via: EgressProxy | undefined,
    /** `host:port` the tunnel is asked for; none for a connection the proxy relays absolute-form. */
    tunnelTarget: string | undefined,
    upstreamTls: boolean,
  ) {
    const hop = via === undefined ? 'the upstream' : 'the egress proxy';
    const accepted = `${hop} did not accept the connection`;
    this.stage = net.isIP(host) === 0 ? `the name lookup of ${host} did not finish` : accepted;
    socket.once('lookup', () => (this.stage = accepted));
    // TLS over the first hop: with the upstream when direct, with an https egress proxy.
    const firstHopTls = via === undefined ? upstreamTls : via.protocol === 'https:';
    if (firstHopTls) socket.once('connect', () => (this.stage = `the TLS handshake with ${hop} did not finish`));
    if (tunnelTarget !== undefined) {
      socket.once(via?.protocol === 'https:' ? 'secureConnect' : 'connect', () => (this.stage = `the egress proxy did not answer CONNECT ${tunnelTarget}`));
    } else if (firstHopTls) {
      socket.once('secureConnect', () => (this.stage = undefined));
    }
  }

  /** The tunnel is open: what is left is TLS with the upstream, if any. */
  tunnelOpened(upstreamTls: boolean): void {
    this.stage = upstreamTls ? 'the TLS handshake with the upstream did not finish' : undefined;
  }

  /** The timeout's detail, naming the egress proxy the connection went through. */
  detail(): string | undefined {
    const through = this.via === undefined ? undefined : `through egress proxy ${this.via.display}`;
    return [this.stage, through].filter((s) => s !== undefined).join('; ') || undefined;
  }
}
