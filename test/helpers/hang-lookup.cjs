// Loaded with `node --require` into a spawned proxy: names under `.hang.test` never resolve, as
// with a DNS server that drops the query (getaddrinfo would give up only after its own retries).
const dns = require('node:dns');
const lookup = dns.lookup;
dns.lookup = function (host, options, callback) {
  if (typeof host === 'string' && host.endsWith('.hang.test')) return {};
  return lookup.call(this, host, options, callback);
};
