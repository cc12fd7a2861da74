/**
 * A deliberately simple, whole-text implementation of the WHATWG event-stream
 * algorithm, used as the oracle for the incremental parser. It decodes all
 * bytes first and splits lines with one regular expression: nothing in it is
 * shared with src/sse/parser.ts. One documented departure from the spec, as in
 * the parser: an event with no data but an `error:` field is an event of type
 * `error` whose data is that field's (last) value.
 */
export interface RefEvent {
  type: string;
  data: string;
  id: string | undefined;
}

export function referenceParse(bytes: Uint8Array): RefEvent[] {
  let text = new TextDecoder('utf-8', { ignoreBOM: false }).decode(bytes); // strips one leading BOM
  const lines = text.split(/\r\n|\r|\n/);
  // The last element is an unterminated line: the spec discards it at EOF.
  lines.pop();
  const events: RefEvent[] = [];
  let data: string[] = [];
  let hasData = false;
  let type = '';
  let id: string | undefined;
  let error: string | undefined;
  for (const line of lines) {
    if (line === '') {
      if (hasData) events.push({ type, data: data.join('\n'), id });
      else if (error !== undefined) events.push({ type: 'error', data: error, id });
      data = [];
      hasData = false;
      type = '';
      error = undefined;
      continue;
    }
    if (line.startsWith(':')) continue;
    const colon = line.indexOf(':');
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'data') {
      data.push(value);
      hasData = true;
    } else if (field === 'event') type = value;
    else if (field === 'error') error = value;
    else if (field === 'id' && !value.includes('\0')) id = value;
  }
  text = '';
  return events;
}
