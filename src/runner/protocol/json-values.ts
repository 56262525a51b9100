/**
 * A bound on what `JSON.parse` and protobuf-es make of a LogItem sent as JSON (Connect, gRPC and gRPC-web with a
 * `+json` content type), checked on its bytes before either sees them: a run's lines are a JSON array, and a string a
 * line held while a slow `authorize` hook runs cost ~325 KB of heap a 120 KiB first message (docs/runner-protocol.md
 * §7; the binary encodings have countRunLines in received-run.ts).
 */
import { MAX_RUN_LINES } from "./received-run.js";

/**
 * Most commas outside strings a LogItem in JSON may hold: those between a run's lines (4,095) and between the fields
 * of the item and its event (a handful), with room to spare.
 */
export const MAX_JSON_COMMAS = MAX_RUN_LINES + 32;

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COMMA = 0x2c;

/**
 * Commas outside JSON strings in `buf[start, end)`: one fewer than the values of each array and object, summed. Stops
 * counting past {@link MAX_JSON_COMMAS} + 1. Any bytes are accepted (it never throws): a message that is no JSON is
 * connect's to refuse. O(bytes), no allocation.
 *
 * @example
 * const refusal = jsonCountRefusal(countJsonCommas(buf, from, end)); // before connect's JSON.parse
 */
export function countJsonCommas(buf: Uint8Array, start: number, end: number): number {
  let commas = 0;
  let i = start;
  while (i < end) {
    const b = buf[i++]!;
    if (b === COMMA) {
      if (++commas > MAX_JSON_COMMAS) return commas;
    } else if (b === QUOTE) {
      // Inside a string: only its closing quote matters, and an escape hides the byte after it.
      while (i < end) {
        const c = buf[i++]!;
        if (c === QUOTE) break;
        if (c === BACKSLASH) i++;
      }
    }
  }
  return commas;
}

/** The one-line refusal of a JSON message with `commas` commas outside strings, or null within the bound. O(1). */
export function jsonCountRefusal(commas: number): string | null {
  return commas > MAX_JSON_COMMAS
    ? `a LogItem in JSON holds at most ${MAX_JSON_COMMAS + 1} values in its arrays and objects (a run at most ` +
        `${MAX_RUN_LINES} lines); split it`
    : null;
}
