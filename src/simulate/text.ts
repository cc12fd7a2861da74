/** The simulated answer, one token per entry; includes a multi-byte character on purpose. */
const VOCAB = [
  'Today', ' in', ' Paris', ' it', ' will', ' be', ' mostly', ' sunny', ' with', ' a', ' high', ' of', ' 22', '°C',
  ' and', ' a', ' light', ' breeze', ' from', ' the', ' west', '.',
];

export function token(k: number): string {
  return VOCAB[k % VOCAB.length]!;
}

export function fullText(n: number): string {
  let s = '';
  for (let k = 0; k < n; k++) s += token(k);
  return s;
}

/** Rough prompt size in tokens (4 characters a token), for usage fields. */
export function promptTokens(body: Record<string, unknown>): number {
  const src = body.messages ?? body.input ?? body.prompt ?? body.contents ?? '';
  return Math.max(1, Math.ceil(JSON.stringify(src).length / 4));
}
