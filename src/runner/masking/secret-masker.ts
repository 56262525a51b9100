/**
 * The secret masker the agent and the service share: a job's secret values, each with
 * the forms it is masked in (docs/runner-protocol.md §14), found in a line's UTF-8 bytes
 * and replaced by `***`. Why this index: docs/decisions/log-masking.md.
 */
import { Buffer } from "node:buffer";
import { RunnerDepotError } from "../../errors.js";

/** What a masked run of bytes becomes. */
export const MASK_TEXT = "***";

/** The shortest secret accepted, in UTF-8 bytes: a shorter one would mask ordinary text. */
export const MIN_SECRET_BYTES = 4;

/** How the reason starts when `add` refuses a value because its forms would pass `maxFormBytes`. */
export const FORMS_REFUSAL = "its forms (";

const MASK_BYTES = Buffer.from(MASK_TEXT, "latin1");
const STAR = 0x2a;
/** Fibonacci hashing's multiplier (2^32 / φ): spreads a 4-byte window over the bitset. */
const HASH = 0x9e3779b1 | 0;
/** The longest window the scan jumps by (a shift is a byte, and a longer one would fill the table). */
const MAX_WINDOW = 32;
/** The shift table's largest number of entries: 4 Mi, 8 MiB with their prints (1,000 secrets of 43 bytes take 2 Mi). */
const MAX_TABLE_LOG2 = 22;
/** A second multiplier for a block's print (its top 8 bits), independent of the table's index. */
const PRINT_HASH = 0x85ebca6b | 0;
/** The print of an entry that holds blocks with different prints: its shift is taken as it is. */
const MIXED = 0;
/**
 * Bytes of forms a scan may compare, per byte scanned, before it gives up and masks the whole
 * range (fail closed): forms sharing a prefix and a line made of it (`::add-mask::` values a
 * job chose) would otherwise cost O(bytes × forms × form length) of the service's one thread.
 */
export const SCAN_WORK_PER_BYTE = 32;
/** What any scan may compare on top of {@link SCAN_WORK_PER_BYTE}: a few long forms found whole. */
export const SCAN_WORK_BASE = 64 * 1024;

/**
 * INVALID_ARGUMENT unless `value` may be masked: at least {@link MIN_SECRET_BYTES} bytes,
 * and a multi-line value with at least one line that long. O(value).
 */
export function checkSecret(value: string): void {
  if (typeof value !== "string") throw new RunnerDepotError("INVALID_ARGUMENT", "a secret must be a string");
  const bytes = Buffer.byteLength(value, "utf8");
  if (bytes < MIN_SECRET_BYTES) {
    throw new RunnerDepotError(
      "INVALID_ARGUMENT",
      `a secret must be at least ${MIN_SECRET_BYTES} bytes (got ${bytes}): a shorter value would mask ordinary text`,
    );
  }
  if (value.includes("\n") && linesOf(value).every((l) => Buffer.byteLength(l, "utf8") < MIN_SECRET_BYTES)) {
    throw new RunnerDepotError(
      "INVALID_ARGUMENT",
      `a multi-line secret needs a line of at least ${MIN_SECRET_BYTES} bytes: each line is masked on its own`,
    );
  }
}

/** A 4-byte block's print: 8 bits of another hash than the table's, never {@link MIXED}. O(1). */
function printOf(block: number): number {
  return Math.imul(block, PRINT_HASH) >>> 24 || 1;
}

/** The lines of a multi-line value, a trailing `\r` dropped (CRLF text). */
function linesOf(value: string): string[] {
  return value.split("\n").map((l) => (l.endsWith("\r") ? l.slice(0, -1) : l));
}

/**
 * The forms of `value` that are masked (docs/runner-protocol.md §14): the value; the value without
 * surrounding blanks, and without surrounding quotes; each line of a multi-line value; base64 (standard and URL-safe: the whole encoding, and the characters
 * that depend on the value alone at each of the three alignments it can have inside a longer
 * encoding); percent-encoding (upper- and lower-case hex); a JSON string's escaping. Only
 * forms of at least {@link MIN_SECRET_BYTES} bytes. O(value).
 */
export function secretForms(value: string): string[] {
  checkSecret(value);
  const forms = new Set<string>([value]);
  if (value.includes("\n") || value.includes("\r")) {
    for (const line of linesOf(value)) forms.add(line);
  }
  // Surrounding blanks and quotes are often lost on the way to a job (a shell strips them, a
  // file's value is trimmed): the value without them is masked too (prior art: actions/runner#440).
  const trimmed = value.trim();
  forms.add(trimmed);
  for (const q of ['"', "'"]) {
    if (trimmed.length > 2 && trimmed.startsWith(q) && trimmed.endsWith(q)) forms.add(trimmed.slice(1, -1).trim());
  }
  const raw = Buffer.from(value, "utf8");
  for (const b64 of base64Forms(raw)) {
    forms.add(b64);
    forms.add(b64.replace(/\+/g, "-").replace(/\//g, "_"));
  }
  // A value of letters, digits and `-_.` only (most tokens) is its own every percent-encoding and JSON escaping built
  // below: skipping them takes about half the time of building a masker for 1,000 tokens.
  if (!PLAIN_TOKEN.test(value)) {
    for (const form of percentEncodings(raw)) forms.add(form);
    for (const form of jsonEscapings(value)) forms.add(form);
  }
  return [...forms].filter((f) => Buffer.byteLength(f, "utf8") >= MIN_SECRET_BYTES);
}

/** The characters every percent-encoding and JSON escaping below leaves as they are (not `~`: form encoding's). */
const PLAIN_TOKEN = /^[A-Za-z0-9\-_.]*$/;

/**
 * Bytes left as they are by `encodeURIComponent`, by RFC 3986 (unreserved only), by Python's `quote` (and `/`), and
 * by form encoding as the WHATWG URL standard (`URLSearchParams`) and Java's `URLEncoder` write it.
 */
const PCT_SAFE = [/[A-Za-z0-9\-_.!~*'()]/, /[A-Za-z0-9\-_.~]/, /[A-Za-z0-9\-_.~/]/, /[A-Za-z0-9*\-._]/].map((re) =>
  Array.from({ length: 0x80 }, (_, byte) => re.test(String.fromCharCode(byte))),
);
/** `%XX` in upper- and lower-case hex, by byte. */
const PCT_UPPER = Array.from({ length: 256 }, (_, b) => `%${b.toString(16).toUpperCase().padStart(2, "0")}`);
const PCT_LOWER = PCT_UPPER.map((h) => h.toLowerCase());

/**
 * Percent-encodings of `raw` as common libraries write them: `encodeURIComponent`, RFC 3986's
 * (PHP `rawurlencode`, Python `quote(safe="")`), Python's `quote` (keeps `/`), form encoding's (`URLSearchParams`,
 * Java's `URLEncoder`: keeps `*`, not `~`), each with space as `%20` or `+`, in upper- and lower-case hex. Most
 * coincide. O(value).
 *
 * @example
 * percentEncodings(Buffer.from("a b/é")); // ["a%20b%2F%C3%A9", "a%20b%2f%c3%a9", "a+b%2F%C3%A9", …]
 */
export function percentEncodings(raw: Buffer): string[] {
  const out: string[] = [];
  for (const safe of PCT_SAFE) {
    for (const space of ["%20", "+"]) {
      for (const hex of [PCT_UPPER, PCT_LOWER]) {
        let text = "";
        for (const byte of raw) {
          if (byte === 0x20) text += space;
          else if (byte < 0x80 && safe[byte]) text += String.fromCharCode(byte);
          else text += hex[byte];
        }
        out.push(text);
      }
    }
  }
  return out;
}

/**
 * The value inside a JSON string as common encoders write it: `JSON.stringify`'s escapes, plus
 * any of `\uXXXX` for non-ASCII (Python's `json.dumps`), for `<`, `>`, `&` (Go's `encoding/json`)
 * and `\/` for `/` (PHP's `json_encode`), in lower- and upper-case hex. Most coincide. O(value).
 *
 * @example
 * jsonEscapings("é/"); // ["é/", "\\u00e9/", …, "é\\/", …] (as JavaScript string literals)
 */
export function jsonEscapings(value: string): string[] {
  const base = JSON.stringify(value).slice(1, -1);
  const out = [base];
  for (let variant = 1; variant < 16; variant++) {
    const upper = (variant & 8) !== 0;
    const hex = (code: number) => {
      const h = code.toString(16).padStart(4, "0");
      return `\\u${upper ? h.toUpperCase() : h}`;
    };
    let text = base.replace(/\\u[0-9a-f]{4}/g, (e) => (upper ? `\\u${e.slice(2).toUpperCase()}` : e));
    if (variant & 1) text = text.replace(/[^\x00-\x7f]/g, (c) => hex(c.charCodeAt(0)));
    if (variant & 2) text = text.replace(/[<>&]/g, (c) => hex(c.charCodeAt(0)));
    if (variant & 4) text = text.replace(/\//g, "\\/");
    out.push(text);
  }
  return out;
}

/**
 * The standard base64 of `raw` (padded), and for each alignment s ∈ {0, 1, 2} (the value
 * preceded by s other bytes) the characters whose 6 bits all come from the value: inside a
 * longer encoding at most one character on each side of them still depends on the value.
 */
function base64Forms(raw: Buffer): string[] {
  const out = [raw.toString("base64")];
  for (let s = 0; s < 3; s++) {
    const shifted = Buffer.concat([Buffer.alloc(s), raw]);
    const first = Math.ceil((8 * s) / 6);
    const end = Math.floor((8 * shifted.length) / 6);
    out.push(shifted.toString("base64").slice(first, end));
  }
  return out;
}

/**
 * A job's secrets, ready to mask lines. Adding a value is O(its forms' bytes) amortised; masking
 * a line is O(its bytes) expected whatever the number of secrets, and typically sublinear: a
 * Wu–Manber scan whose window (the shortest form, ≤ 32 bytes) jumps by a table of the 4-byte
 * blocks the forms start with, and only where a form may start are the forms with that 4-byte
 * prefix compared (docs/decisions/log-masking.md).
 */
export interface SecretMasker {
  /**
   * Registers a value (all its forms); INVALID_ARGUMENT when {@link checkSecret} refuses it, or when its forms would
   * take {@link formBytes} past `maxFormBytes` (nothing of it is then added).
   */
  add(value: string, maxFormBytes?: number): void;
  /** How many values were added (duplicates counted once). */
  readonly size: number;
  /** UTF-8 bytes of the values added. */
  readonly valueBytes: number;
  /**
   * UTF-8 bytes of the forms held (each once): what the values cost in memory, up to ~150× their own bytes for a
   * value crafted so every encoding differs (docs/decisions/log-masking.md, "Limits").
   */
  readonly formBytes: number;
  /**
   * `buf[start, end)` with every secret form replaced by `***` (a maximal run of masked bytes
   * becomes one `***`); null when nothing matched, so the caller keeps its bytes.
   */
  maskBytes(buf: Uint8Array, start?: number, end?: number): Buffer | null;
  /** `line` with every secret form replaced by `***` (the same line object when nothing matched). */
  mask(line: string): string;
  /** UTF-8 bytes of the longest form (0 when empty): how far a form may reach past a cut. */
  readonly longestForm: number;
  /** The masked runs of `buf[start, end)` as [from, to) pairs (absolute), or null when none. O(bytes) expected. */
  runs(buf: Uint8Array, start: number, end: number): number[] | null;
  /**
   * Where the first masked run of `buf[start, end)` starts (`runs(…)[0]`), or -1 when none: the scan stops there.
   * O(bytes up to it) expected.
   */
  firstRunStart(buf: Uint8Array, start: number, end: number): number;
}

/**
 * Creates a masker holding `values` (each checked by {@link checkSecret}).
 *
 * @example
 * const masker = createSecretMasker(["hunter2-token"]);
 * masker.mask("login with hunter2-token"); // "login with ***"
 */
export function createSecretMasker(values: readonly string[] = []): SecretMasker {
  // Forms by their first 4 bytes (big-endian int32); a form is ≥ 4 bytes by construction.
  const byPrefix = new Map<number, Buffer[]>();
  const all: Buffer[] = [];
  const seen = new Set<string>();
  let valueBytes = 0;
  let formBytes = 0;
  // A form holding `*` can reappear once its neighbours are replaced by `***`: mask again then.
  let starForm = false;
  let longestForm = 0;
  // Wu–Manber: `m` is the window (the shortest form, at most MAX_WINDOW); shifts[h(block)] is how
  // far the window's end may move when its last 4 bytes are that block (0: a form may start at its start).
  let m = MAX_WINDOW;
  let log2 = 10;
  let shifts = new Uint8Array(1 << log2).fill(m - 3);
  // The print of the blocks an entry holds (MIXED when they differ): a scanned block whose print differs is none of
  // them, so it takes the full jump. Without it, one collision gave a line of one repeated character (one block) a
  // short jump, or none, in every window (docs/decisions/log-masking.md, "Prints").
  let prints = new Uint8Array(1 << log2);

  /** Records the blocks of `form`'s first m bytes. O(m). */
  const index = (form: Buffer) => {
    const bits = 32 - log2;
    for (let j = 3; j < m; j++) {
      const block = form.readInt32BE(j - 3);
      const h = Math.imul(block, HASH) >>> bits;
      const shift = m - 1 - j;
      // An entry no block set yet has the full jump, m − 3; a block sets at most m − 4.
      const print = printOf(block);
      if (shifts[h] === m - 3) prints[h] = print;
      else if (prints[h] !== print) prints[h] = MIXED;
      if (shifts[h]! > shift) shifts[h] = shift;
    }
  };
  const addForm = (form: Buffer) => {
    // Signed, as the scan's block is (an int32 shifted left).
    const key = form.readInt32BE(0);
    const list = byPrefix.get(key);
    if (list === undefined) byPrefix.set(key, [form]);
    else if (list.some((f) => f.equals(form))) return;
    else list.push(form);
    all.push(form);
    formBytes += form.length;
    if (form.includes(STAR)) starForm = true;
    if (form.length > longestForm) longestForm = form.length;
    const window = Math.min(m, form.length);
    // Keep the table's load ≤ 1/8 of its entries; a shorter window or a larger table rebuilds it
    // (O(forms × m); the window only shrinks and the table only doubles, so O(log) rebuilds).
    let grow = false;
    while (all.length * (window - 3) * 8 > 1 << log2 && log2 < MAX_TABLE_LOG2) {
      log2++;
      grow = true;
    }
    if (grow || window < m) {
      m = window;
      shifts = new Uint8Array(1 << log2).fill(m - 3);
      prints = new Uint8Array(1 << log2);
      for (const f of all) index(f);
    } else index(form);
  };

  /**
   * Every masked run of `buf[start, end)`: the window's end jumps by the shift of its last
   * 4 bytes (m − 3 bytes for a block no form's first m bytes hold), and only where the shift
   * is 0 are the forms starting at the window's start compared. O(bytes / (m − 3)) typical,
   * O(bytes) expected at worst.
   */
  const scan = (buf: Uint8Array, start: number, end: number, firstOnly = false): number[] | null => {
    // Locals, not the closure's mutable bindings: the loop then keeps them in registers.
    const table = shifts;
    const printTable = prints;
    const bits = 32 - log2;
    const window = m;
    const full = window - 3;
    let runs: number[] | null = null;
    let runStart = -1;
    let runEnd = -1;
    spent = 0;
    const budget = SCAN_WORK_PER_BYTE * (end - start) + SCAN_WORK_BASE;
    for (let i = start + window - 1; i < end;) {
      const block = (buf[i - 3]! << 24) | (buf[i - 2]! << 16) | (buf[i - 1]! << 8) | buf[i]!;
      const h = Math.imul(block, HASH) >>> bits;
      let shift = table[h]!;
      if (shift !== full) {
        const print = printTable[h]!;
        if (print !== MIXED && print !== printOf(block)) shift = full;
      }
      if (shift !== 0) {
        i += shift;
        continue;
      }
      const s = i - window + 1;
      i++;
      const key = (buf[s]! << 24) | (buf[s + 1]! << 16) | (buf[s + 2]! << 8) | buf[s + 3]!;
      const longest = longestAt(buf, s, end, key);
      // Over budget: the whole range is one masked run (never a form left in clear). O(budget) at most.
      if (spent > budget) return [start, end];
      if (longest === 0) continue;
      // Windows come in order of their start, so the first form found starts the first run.
      if (firstOnly) return [s, s + longest];
      if (s <= runEnd) {
        if (s + longest > runEnd) runEnd = s + longest;
      } else {
        if (runEnd !== -1) (runs ??= []).push(runStart, runEnd);
        runStart = s;
        runEnd = s + longest;
      }
    }
    if (runEnd !== -1) (runs ??= []).push(runStart, runEnd);
    return runs;
  };

  /** Bytes of forms the current scan compared (each compare counted at its form's length, plus 8). */
  let spent = 0;
  /** The longest form at `buf[s…]` whose first 4 bytes are `key`, or 0. O(forms with that prefix × their bytes). */
  const longestAt = (buf: Uint8Array, s: number, end: number, key: number): number => {
    const list = byPrefix.get(key);
    if (list === undefined) return 0;
    let longest = 0;
    for (const f of list) {
      if (f.length > longest && s + f.length <= end) {
        spent += f.length + 8;
        if (equalAt(buf, s, f)) longest = f.length;
      }
    }
    return longest;
  };

  const maskBytes = (buf: Uint8Array, start = 0, end = buf.length): Buffer | null => {
    if (all.length === 0 || end - start < m) return null;
    let runs = scan(buf, start, end);
    if (runs === null) return null;
    let out = replaceRuns(buf, start, end, runs);
    // Each pass shrinks the line (a run of ≥ 4 bytes becomes 3), so this ends.
    while (starForm && (runs = scan(out, 0, out.length)) !== null) out = replaceRuns(out, 0, out.length, runs);
    return out;
  };

  const addValue = (value: string, forms: readonly string[], maxFormBytes = Infinity) => {
    const encoded = forms.map((f) => Buffer.from(f, "utf8"));
    // Every form counted, duplicates of held ones too: a bound that holds before any is added.
    const bytes = encoded.reduce((n, f) => n + f.length, 0);
    if (formBytes + bytes > maxFormBytes) {
      throw new RunnerDepotError(
        "INVALID_ARGUMENT",
        `${FORMS_REFUSAL}${bytes} bytes) would take the job's past ${maxFormBytes} bytes of forms`,
      );
    }
    seen.add(value);
    valueBytes += Buffer.byteLength(value, "utf8");
    for (const form of encoded) addForm(form);
  };
  /**
   * Sizes the table for `forms` (distinct) before they are added, so adding them never grows it: grown form by form,
   * each doubling re-indexed every form before it. O(table entries + forms × m).
   */
  const reserve = (forms: ReadonlySet<string>) => {
    let window = m;
    for (const f of forms) window = Math.min(window, Buffer.byteLength(f, "utf8"));
    let size = log2;
    while (forms.size * (window - 3) * 8 > 1 << size && size < MAX_TABLE_LOG2) size++;
    if (size === log2 && window === m) return;
    log2 = size;
    m = window;
    shifts = new Uint8Array(1 << log2).fill(m - 3);
    prints = new Uint8Array(1 << log2);
    for (const f of all) index(f);
  };

  const masker: SecretMasker = {
    add(value, maxFormBytes) {
      if (!seen.has(value)) addValue(value, secretForms(value), maxFormBytes);
    },
    get size() {
      return seen.size;
    },
    get valueBytes() {
      return valueBytes;
    },
    get formBytes() {
      return formBytes;
    },
    get longestForm() {
      return longestForm;
    },
    runs: (buf, start, end) => (all.length === 0 || end - start < m ? null : scan(buf, start, end)),
    firstRunStart: (buf, start, end) =>
      all.length === 0 || end - start < m ? -1 : (scan(buf, start, end, true)?.[0] ?? -1),
    maskBytes,
    mask(line) {
      if (all.length === 0 || line.length < 2) return line;
      const buf = Buffer.from(line, "utf8");
      const out = maskBytes(buf, 0, buf.length);
      return out === null ? line : out.toString("utf8");
    },
  };
  const initial = new Map<string, string[]>();
  for (const value of values) if (!initial.has(value)) initial.set(value, secretForms(value));
  reserve(new Set([...initial.values()].flat()));
  for (const [value, forms] of initial) addValue(value, forms);
  return masker;
}

/**
 * Where to cut a line over the line limit that has no newline yet, at or before `cut`
 * (> `pos`), so that no secret form straddles the cut: a piece holds a form whole, or
 * none of it, and is masked on its own. `buf[pos, buf.length)` is longer than the limit.
 * O(limit) expected.
 *
 * @example
 * cut = safeCut(masker, buf, pos, pos + maxLineBytes);
 */
export function safeCut(masker: SecretMasker, buf: Uint8Array, pos: number, cut: number): number {
  // A form starting before the cut ends within `reach` bytes of it: look that far past it,
  // so a form straddling the cut is seen whole (never only its first bytes).
  const reach = Math.min(masker.longestForm, Math.floor((cut - pos) / 2));
  if (reach === 0) return cut;
  let at = Math.min(cut, buf.length - reach);
  while (at > pos + 1 && (buf[at]! & 0xc0) === 0x80) at--;
  const runs = masker.runs(buf, pos, Math.min(buf.length, at + reach));
  if (runs === null) return at;
  for (let k = 0; k < runs.length; k += 2) {
    const from = runs[k]!;
    const to = runs[k + 1]!;
    if (from < at && to > at) return from > pos ? from : to - pos <= cut - pos ? to : at;
  }
  return at;
}

/** Whether `form` is at `buf[s…]` (its first 4 bytes already are). O(form). */
function equalAt(buf: Uint8Array, s: number, form: Buffer): boolean {
  const n = form.length;
  if (n <= 16) {
    for (let k = 4; k < n; k++) if (buf[s + k] !== form[k]) return false;
    return true;
  }
  return form.compare(buf, s + 4, s + n, 4, n) === 0;
}

/** `buf[start, end)` with each run [runs[2k], runs[2k+1]) replaced by `***`. O(bytes). */
function replaceRuns(buf: Uint8Array, start: number, end: number, runs: number[]): Buffer {
  let size = end - start;
  for (let k = 0; k < runs.length; k += 2) size -= runs[k + 1]! - runs[k]! - MASK_BYTES.length;
  const out = Buffer.allocUnsafe(size);
  let at = 0;
  let from = start;
  for (let k = 0; k < runs.length; k += 2) {
    at += Buffer.from(buf.buffer, buf.byteOffset + from, runs[k]! - from).copy(out, at);
    at += MASK_BYTES.copy(out, at);
    from = runs[k + 1]!;
  }
  Buffer.from(buf.buffer, buf.byteOffset + from, end - from).copy(out, at);
  return out;
}
