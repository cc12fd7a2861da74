import tls from 'node:tls';

let shared: tls.SecureContext | undefined;

/**
 * One client TLS context for every upstream connection. Without it tls.connect builds one per
 * call, on the event loop every stream's events wait on: tls.connect took 0.72-0.82 ms before
 * it returned, 0.09 ms with this context (bench/README.md). It holds the CAs a default
 * tls.connect would use (Node's bundle, NODE_EXTRA_CA_CERTS, --use-openssl-ca); sessions,
 * server name and ALPN stay per connection.
 */
export function upstreamTlsContext(): tls.SecureContext {
  return (shared ??= tls.createSecureContext());
}
