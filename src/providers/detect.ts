import { anthropicMessages, anthropicVertex } from './anthropic.js';
import { bedrockConverse, bedrockInvoke } from './bedrock.js';
import { cohereChat } from './cohere.js';
import { geminiStream } from './gemini.js';
import { geminiInteractions, geminiInteractionsResumed } from './gemini-interactions.js';
import { genericStream } from './generic.js';
import { ollamaChat, ollamaGenerate } from './ollama.js';
import { lmstudioChat } from './lmstudio.js';
import { azureOpenaiChat, azureOpenaiCompletions, llamacppCompletion, openaiChat, openaiCompletions, vertexPartnerChat, workersAi } from './openai-chat.js';
import { openaiResponses, openaiResponsesResumed } from './openai-responses.js';
import { sglangGenerate } from './sglang.js';
import { tgiGenerate } from './tgi.js';
import { tritonGenerate } from './triton.js';
import type { ApiDescriptor } from './types.js';

/** The same API under another default `gen_ai.provider.name`. */
function named(api: ApiDescriptor, providerName: string): ApiDescriptor {
  return { ...api, defaultProviderName: providerName };
}

/**
 * `/generate` by its path: SGLang streams there, but TGI (one JSON answer) and vLLM's demo
 * server answer there too, so the provider label comes from the route or its host.
 */
const generateByPath = named(sglangGenerate, '_OTHER');

/**
 * Adapters selectable by name in a route's `provider:` setting. Names are the
 * `gen_ai.provider.name` values where there is one, plus API ids.
 */
export const API_BY_NAME: Readonly<Record<string, ApiDescriptor>> = {
  openai: openaiChat,
  'openai-chat': openaiChat,
  'openai-compatible': openaiChat,
  'openai-completions': openaiCompletions,
  'openai-responses': openaiResponses,
  'azure.ai.openai': azureOpenaiChat,
  azure: azureOpenaiChat,
  vllm: named(openaiChat, 'vllm'),
  'llama.cpp': named(openaiChat, 'llama.cpp'),
  'llama.cpp-completion': llamacppCompletion,
  tgi: named(openaiChat, 'tgi'),
  'tgi-generate': tgiGenerate,
  'sglang-generate': sglangGenerate,
  'triton-generate': tritonGenerate,
  cohere: cohereChat,
  lmstudio: lmstudioChat,
  'workers-ai': workersAi,
  'cloudflare.workers_ai': workersAi,
  deepseek: named(openaiChat, 'deepseek'),
  groq: named(openaiChat, 'groq'),
  openrouter: named(openaiChat, 'openrouter'),
  anthropic: anthropicMessages,
  'gcp.vertex_ai.anthropic': anthropicVertex,
  gemini: geminiStream,
  'gcp.gemini': geminiStream,
  'gcp.vertex_ai': named(geminiStream, 'gcp.vertex_ai'),
  'gemini-interactions': geminiInteractions,
  ollama: ollamaChat,
  'ollama-chat': ollamaChat,
  'ollama-generate': ollamaGenerate,
  bedrock: bedrockConverse,
  'aws.bedrock': bedrockConverse,
  'bedrock-converse': bedrockConverse,
  'bedrock-invoke': bedrockInvoke,
  generic: genericStream,
};

/** Path rules of the APIs we understand, checked against the forwarded path (without its query). */
const PATH_RULES: ReadonlyArray<readonly [RegExp, ApiDescriptor]> = [
  [/\/openai\/deployments\/[^/]+\/chat\/completions$/, azureOpenaiChat],
  [/\/openai\/deployments\/[^/]+\/completions$/, azureOpenaiCompletions],
  [/(?:^|\/)chat\/completions$/, openaiChat],
  [/(?:^|\/)completions$/, openaiCompletions],
  [/(?:^|\/)responses$/, openaiResponses],
  // Bedrock serves embedding models on `/invoke` too (Titan, Cohere, Nova, Marengo): not measured,
  // like every other embeddings API, so that they do not count as chat.
  [/\/model\/[^/]*embed[^/]*\/invoke$/i, genericStream],
  [/\/model\/[^/]+\/(?:converse-stream|converse)$/, bedrockConverse],
  [/\/model\/[^/]+\/(?:invoke-with-response-stream|invoke)$/, bedrockInvoke],
  [/\/(?:models|endpoints|tunedModels)\/[^/:]+:(?:streamGenerateContent|generateContent)$/, geminiStream],
  [/\/publishers\/anthropic\/models\/[^/:]+:(?:stream)?[rR]awPredict$/, anthropicVertex],
  // The other partner models there: Mistral's and AI21's chat, except embeddings and OCR (not generation).
  [/\/publishers\/[^/]+\/models\/[^/:]*(?:embed|ocr)[^/:]*:(?:stream)?[rR]awPredict$/, genericStream],
  [/\/publishers\/[^/]+\/models\/[^/:]+:(?:stream)?[rR]awPredict$/, vertexPartnerChat],
  [/(?:^|\/)v1\/messages$/, anthropicMessages],
  [/(?:^|\/)api\/chat$/, ollamaChat],
  [/(?:^|\/)api\/generate$/, ollamaGenerate],
  [/\/v1[a-z0-9]*\/(?:projects\/[^/]+\/locations\/[^/]+\/)?interactions$/, geminiInteractions],
  // Self-hosted servers' own APIs (after Ollama's `/api/generate`).
  // Not `/api/…/completion` (an app's own route, e.g. the Vercel AI SDK's `useCompletion`) nor
  // `/api/…/generate` (KoboldCpp, text-generation-webui): other formats.
  [/(?:^|\/)(?<!(?:^|\/)api\/(?:[^/]+\/)*)(?:completion|infill)$/, llamacppCompletion],
  [/\/v2\/models\/[^/]+(?:\/versions\/[^/]+)?\/generate(?:_stream)?$/, tritonGenerate],
  [/(?:^|\/)generate_stream$/, tgiGenerate],
  [/(?:^|\/)(?<!(?:^|\/)api\/(?:[^/]+\/)*)generate$/, generateByPath],
  [/(?:^|\/)v2\/chat$/, cohereChat],
  [/\/(?:ai\/run|workers-ai(?:\/run)?)\/(?:@|%40).+$/, workersAi],
];

const COHERE_V1 = /(?:^|\/)v1\/chat$/;
const LMSTUDIO_CHAT = /(?:^|\/)api\/v1\/chat$/;
const RESPONSE_BY_ID = /(?:^|\/)responses\/resp_[^/]+$/;
const INTERACTION_BY_ID = /\/v1[a-z0-9]*\/(?:projects\/[^/]+\/locations\/[^/]+\/)?interactions\/[^/]+$/;
const STREAM_TRUE = /(?:^|&)stream=true(?:&|$)/;

/**
 * The API of a request: the route's explicit `provider` first, then the
 * path (for a path other APIs share, with the provider names the route gives:
 * its `providerName` and the one its host implies), then the generic fallback
 * (streams are timed, nothing else is measured). Generation calls are POSTs: any
 * other method gets the fallback (a CORS preflight, `GET /v1/chat/completions`
 * listing stored completions), except a GET that resumes a Responses or Interactions
 * stream. Undefined is no longer returned; the signature keeps it so that
 * callers may treat "no API" as before.
 */
export function detectApi(path: string, routeProvider: string | undefined, providerNames: readonly string[] = [], method = 'POST'): ApiDescriptor | undefined {
  if (method !== 'POST') return method === 'GET' ? (resumedStream(path) ?? genericStream) : genericStream;
  if (routeProvider !== undefined) {
    const forced = API_BY_NAME[routeProvider];
    if (forced) return forced;
  }
  const q = path.indexOf('?');
  const p = q === -1 ? path : path.slice(0, q);
  for (const [re, api] of PATH_RULES) if (re.test(p)) return api;
  // Paths other APIs use too, on a route to the provider (its host, or `providerName`) only:
  // Cohere's v1 Chat (Writer serves OpenAI-shaped chunks at `/v1/chat`) and LM Studio's
  // native chat (`/api/v1/chat` is a common route name in apps).
  if (providerNames.includes('cohere') && COHERE_V1.test(p)) return cohereChat;
  if (providerNames.includes('lmstudio') && LMSTUDIO_CHAT.test(p)) return lmstudioChat;
  return resumedStream(path) ?? genericStream;
}

/**
 * Resuming a background response's stream (a GET); without `stream=true` the same path
 * retrieves a stored response, whose usage the request that made it has already counted.
 */
function resumedStream(path: string): ApiDescriptor | undefined {
  const q = path.indexOf('?');
  if (q === -1 || !STREAM_TRUE.test(path.slice(q + 1))) return undefined;
  const p = path.slice(0, q);
  if (RESPONSE_BY_ID.test(p)) return openaiResponsesResumed;
  if (INTERACTION_BY_ID.test(p)) return geminiInteractionsResumed; // the same for a Gemini interaction
  return undefined;
}

/** `gen_ai.provider.name` for well-known hosts (semantic-convention values). */
const HOST_PROVIDERS: ReadonlyArray<readonly [RegExp, string]> = [
  [/(^|\.)openai\.azure\.com$/, 'azure.ai.openai'],
  // Azure OpenAI resources of the AI Services kind: `{resource}.cognitiveservices.azure.com`.
  [/(^|\.)cognitiveservices\.azure\.com$/, 'azure.ai.openai'],
  [/(^|\.)services\.ai\.azure\.com$/, 'azure.ai.inference'],
  [/(^|\.)api\.openai\.com$/, 'openai'],
  [/(^|\.)anthropic\.com$/, 'anthropic'],
  [/(^|\.)generativelanguage\.googleapis\.com$/, 'gcp.gemini'],
  // Vertex AI's regional endpoints are `{region}-aiplatform.googleapis.com`.
  [/(^|[.-])aiplatform\.googleapis\.com$/, 'gcp.vertex_ai'],
  [/^bedrock-runtime(?:-fips)?\..*amazonaws\.com$/, 'aws.bedrock'],
  [/(^|\.)deepseek\.com$/, 'deepseek'],
  [/(^|\.)groq\.com$/, 'groq'],
  [/(^|\.)mistral\.ai$/, 'mistral_ai'],
  [/(^|\.)cohere\.(?:com|ai)$/, 'cohere'],
  [/(^|\.)x\.ai$/, 'x_ai'],
  [/(^|\.)perplexity\.ai$/, 'perplexity'],
  [/(^|\.)moonshot\.(?:ai|cn)$/, 'moonshot_ai'],
  [/(^|\.)openrouter\.ai$/, 'openrouter'],
];

export function providerNameForHost(hostname: string): string | undefined {
  const h = hostname.toLowerCase();
  for (const [re, name] of HOST_PROVIDERS) if (re.test(h)) return name;
  return undefined;
}
