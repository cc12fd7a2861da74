import { openaiChat, openaiCompletions } from './openai-chat.js';
import type { ApiDescriptor } from './types.js';

/** Adapters selectable by name in a route's `provider:` setting. */
export const API_BY_NAME: Readonly<Record<string, ApiDescriptor>> = {
  openai: openaiChat,
  'openai-chat': openaiChat,
  'openai-completions': openaiCompletions,
};

/** Path suffixes of the APIs we understand, checked against the forwarded path. */
const PATH_RULES: ReadonlyArray<readonly [RegExp, ApiDescriptor]> = [
  [/(?:^|\/)chat\/completions$/, openaiChat],
  [/(?:^|\/)completions$/, openaiCompletions],
];

/**
 * The API of a request, from the route's explicit `provider` first, then the
 * path. Undefined: not an LLM API we know; the request is still forwarded.
 */
export function detectApi(path: string, routeProvider: string | undefined): ApiDescriptor | undefined {
  if (routeProvider !== undefined) {
    const forced = API_BY_NAME[routeProvider];
    if (forced) return forced;
  }
  const q = path.indexOf('?');
  const p = q === -1 ? path : path.slice(0, q);
  for (const [re, api] of PATH_RULES) if (re.test(p)) return api;
  return undefined;
}

/** `gen_ai.provider.name` for well-known hosts (semantic-convention values). */
const HOST_PROVIDERS: ReadonlyArray<readonly [RegExp, string]> = [
  [/(^|\.)openai\.azure\.com$/, 'azure.ai.openai'],
  [/(^|\.)services\.ai\.azure\.com$/, 'azure.ai.inference'],
  [/(^|\.)api\.openai\.com$/, 'openai'],
  [/(^|\.)anthropic\.com$/, 'anthropic'],
  [/(^|\.)generativelanguage\.googleapis\.com$/, 'gcp.gemini'],
  [/(^|\.)aiplatform\.googleapis\.com$/, 'gcp.vertex_ai'],
  [/^bedrock-runtime\..*amazonaws\.com$/, 'aws.bedrock'],
  [/(^|\.)deepseek\.com$/, 'deepseek'],
  [/(^|\.)groq\.com$/, 'groq'],
  [/(^|\.)mistral\.ai$/, 'mistral_ai'],
  [/(^|\.)x\.ai$/, 'x_ai'],
  [/(^|\.)perplexity\.ai$/, 'perplexity'],
  [/(^|\.)openrouter\.ai$/, 'openrouter'],
];

export function providerNameForHost(hostname: string): string | undefined {
  const h = hostname.toLowerCase();
  for (const [re, name] of HOST_PROVIDERS) if (re.test(h)) return name;
  return undefined;
}
