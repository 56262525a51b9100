/**
 * Paging of `GET /summary/{trans_id}`: a transaction of 100,000 items is answered a page
 * at a time (`limit`, an opaque `after` cursor, `next` in the body and a `Link: rel="next"`
 * header), so one request costs O(page), not O(transaction).
 */
import { RunnerDepotError } from "../../errors.js";
import type { ManifestItem, ManifestLicense } from "../package/archive.js";
import type { PackageStore } from "../ports.js";
import { keys, mapLimit, remember, type ItemRecord, type TransactionRecord } from "../store/records.js";
import { compareUtf8 } from "../package/paths.js";
import { withoutState } from "./lifecycle.js";

/** Items per summary page when `limit` is not given. */
const DEFAULT_SUMMARY_PAGE = 1_000;
/** The largest `limit` accepted. */
const MAX_SUMMARY_PAGE = 10_000;

/** Which page of a summary a request asks for. */
interface SummaryPage {
  limit: number;
  /** The cursor of the previous page's `next`; absent for the first page. */
  after?: string;
}

/** Reads `limit` and `after` from the query; BAD_REQUEST when malformed. */
export function summaryPage(request: Request): SummaryPage {
  const query = new URL(request.url).searchParams;
  const rawLimit = query.get("limit");
  let limit = DEFAULT_SUMMARY_PAGE;
  if (rawLimit !== null) {
    if (!/^\d{1,6}$/.test(rawLimit) || Number(rawLimit) < 1 || Number(rawLimit) > MAX_SUMMARY_PAGE) {
      throw new RunnerDepotError("BAD_REQUEST", `limit must be an integer from 1 to ${MAX_SUMMARY_PAGE}`);
    }
    limit = Number(rawLimit);
  }
  const after = query.get("after") ?? undefined;
  if (after !== undefined && !/^(?:[0-9a-f]{64}|\d{1,9})$/.test(after)) {
    throw new RunnerDepotError("BAD_REQUEST", "after must be the `next` cursor of a previous summary page");
  }
  return { limit, after };
}

/**
 * One page of an open transaction's items, in the store's key order (a hash of the path,
 * so stable while items are added, but not archive order); within the page, sorted by
 * path. `next` is the cursor of the following page, null on the last. Items still being
 * added (`pending`) are not shown, so a page may hold fewer than `limit`.
 * O(limit) record reads plus one key listing.
 */
export async function summaryItems(
  store: PackageStore,
  trans: TransactionRecord,
  page: SummaryPage,
): Promise<{ items: ItemRecord[]; next: string | null }> {
  const prefix = keys.items(trans.id);
  if (page.after !== undefined && !/^[0-9a-f]{64}$/.test(page.after)) {
    throw new RunnerDepotError("BAD_REQUEST", "after is not a cursor of this transaction's summary");
  }
  const listed = await store.listRecords(prefix, {
    cursor: page.after === undefined ? undefined : prefix + page.after,
    limit: page.limit,
  });
  const records = await mapLimit(listed.keys, 32, async (key) => (await store.getRecord<ItemRecord>(key))?.value);
  const items = records
    .filter((i): i is ItemRecord => i !== undefined && (i.state ?? "added") === "added")
    .map(withoutState)
    .sort((a, b) => compareUtf8(a.path, b.path));
  const last = listed.keys.at(-1);
  return { items, next: listed.cursor !== undefined && last !== undefined ? last.slice(prefix.length) : null };
}

/** Where the page after `index` items starts in a manifest blob: remembered per process, see pageOfCommitted. */
export interface ManifestHint {
  /** The byte offset of item `index` (its first byte). */
  item: number;
  /** The bytes of the `licenses` value: [start, end). */
  licenses: [number, number];
  /** Bytes an item took on the page before, on average: the first read of the next page is sized by it. */
  perItem: number;
}
/** Hints kept (about 150 bytes each). */
const MANIFEST_HINTS = 1_000;
/** The first ranged read of a manifest (or more, sized by a hint), and the largest: each next one doubles. */
const FIRST_WINDOW = 16 * 1024;
const LAST_WINDOW = 1024 * 1024;

/**
 * One page of a committed version's items, in archive order (the cursor is an item offset), with its licences,
 * read from the manifest blob (`digest`) in ranges that stop after the page's last item and the next one's first
 * byte: nothing else is parsed, skipped items are only scanned. A page answered records in `hints` where the next
 * one starts, so a walk along `next` on this process reads, per page, the licences and the page's items: O(limit).
 * A cursor without a hint (another replica, or evicted) costs O(bytes before the page's end): the manifest's
 * head (its attributes, which the answer carries anyway) and `after + limit` items scanned.
 * Null when the blob is gone.
 *
 * @example
 * const hints = new Map<string, ManifestHint>();
 * const first = await pageOfCommitted(store, version.manifest, { limit: 1000 }, hints);
 * const second = await pageOfCommitted(store, version.manifest, { limit: 1000, after: first!.next! }, hints);
 */
export async function pageOfCommitted(
  store: PackageStore,
  digest: string | undefined,
  page: SummaryPage,
  hints: Map<string, ManifestHint>,
): Promise<{ items: ManifestItem[]; next: string | null; licenses: ManifestLicense[] } | null> {
  if (page.after !== undefined && !/^\d{1,9}$/.test(page.after)) {
    throw new RunnerDepotError("BAD_REQUEST", "after is not a cursor of this transaction's summary");
  }
  const start = page.after === undefined ? 0 : Number(page.after);
  const end = start + page.limit;
  const size = digest === undefined ? undefined : (await store.statBlob(digest))?.size;
  if (digest === undefined || size === undefined) return null;
  const hint = start > 0 ? hints.get(`${digest}@${start}`) : undefined;
  if (hint) remember(hints, `${digest}@${start}`, hint, MANIFEST_HINTS);
  const items: ManifestItem[] = [];
  const read = { store, digest, size, start, end, items };
  const { licenses, licenseSpan, more, first } = hint
    ? await pageAtHint(read, hint, page.limit)
    : await pageFromHead(read);
  if (more !== undefined && first !== undefined && licenseSpan) {
    const perItem = Math.ceil((more - first) / page.limit);
    remember(hints, `${digest}@${end}`, { item: more, licenses: licenseSpan, perItem }, MANIFEST_HINTS);
  }
  return { items, next: more !== undefined ? String(end) : null, licenses };
}

/** A page's read: the manifest blob, the items wanted [start, end), and where they go. */
interface PageRead {
  store: PackageStore;
  digest: string;
  size: number;
  start: number;
  end: number;
  items: ManifestItem[];
}

/** What a page's read found: the licences and their bytes, the offsets of item `start` and item `end`. */
interface PageFound {
  licenses: ManifestLicense[];
  licenseSpan?: [number, number];
  more?: number;
  first?: number;
}

/** The page from a hint: the licences read at their bytes, the items from the page's first. O(limit). */
async function pageAtHint(read: PageRead, hint: ManifestHint, limit: number): Promise<PageFound> {
  const { store, digest, size, start, end, items } = read;
  const [from, to] = hint.licenses;
  const licenses = (JSON.parse((await readRange(store, digest, from, to)).toString("utf8")) ?? []) as ManifestLicense[];
  const json = new JsonScanner(ranges(store, digest, hint.item, size, hint.perItem * limit + 1024), hint.item);
  try {
    return { licenses, licenseSpan: hint.licenses, ...(await scanItems(json, start, end, start, items, false)) };
  } finally {
    await json.close();
  }
}

/** The page read from the manifest's start: its keys in turn, items before the page scanned. O(bytes to the page's end). */
async function pageFromHead(read: PageRead): Promise<PageFound> {
  const { store, digest, size, start, end, items } = read;
  const json = new JsonScanner(ranges(store, digest, 0, size, FIRST_WINDOW), 0);
  const found: PageFound = { licenses: [] };
  try {
    let itemsDone = false;
    await json.expect(OPEN_OBJECT);
    if ((await json.peek()) === CLOSE_OBJECT) return found;
    for (;;) {
      const key = JSON.parse((await json.value(true))!.toString("utf8")) as unknown;
      await json.expect(COLON);
      if (key === "licenses") {
        await json.skipSpace();
        const from = json.position;
        // As the whole manifest's `licenses ?? []` answered before; a manifest this depot writes has a list.
        found.licenses = (JSON.parse((await json.value(true))!.toString("utf8")) ?? []) as ManifestLicense[];
        found.licenseSpan = [from, json.position];
      } else if (key === "items" && !itemsDone) {
        // The first `items` is the list (JSON.parse would take a repeated key's last): a manifest this depot writes
        // holds each key once, `licenses` before `items` (transactions/commit.ts), so with the licences read the
        // scan stops after the page.
        itemsDone = true;
        await json.expect(OPEN_ARRAY);
        Object.assign(found, await scanItems(json, 0, end, start, items, found.licenseSpan === undefined));
        if (found.licenseSpan) return found;
      } else await json.value(false);
      const b = await json.peek();
      json.skipByte();
      if (b === CLOSE_OBJECT) return found;
      if (b !== COMMA) throw malformed();
    }
  } finally {
    await json.close();
  }
}

/**
 * Reads items from item `index` (just past the `[` when 0) keeping items `keep` to `end` (exclusive) into `out`.
 * Answers the offsets of item `keep` and of item `end`, when there are such; stops at item `end` unless `finish`
 * (then it reads on, keeping nothing); the closing `]` consumed whenever reached.
 */
async function scanItems(
  json: JsonScanner,
  index: number,
  end: number,
  keep: number,
  out: ManifestItem[],
  finish: boolean,
): Promise<{ more?: number; first?: number }> {
  if (index === 0 && (await json.peek()) === CLOSE_ARRAY) {
    json.skipByte();
    return {};
  }
  let more: number | undefined;
  let first: number | undefined;
  for (;;) {
    await json.skipSpace();
    if (index === keep) first = json.position;
    if (index === end) {
      more = json.position;
      if (!finish) return { more, first };
    }
    const bytes = await json.value(index >= keep && index < end);
    if (bytes) out.push(JSON.parse(bytes.toString("utf8")) as ManifestItem);
    index++;
    const b = await json.peek();
    json.skipByte();
    if (b === CLOSE_ARRAY) return { more, first };
    if (b !== COMMA) throw malformed();
  }
}

const OPEN_OBJECT = 0x7b;
const CLOSE_OBJECT = 0x7d;
const OPEN_ARRAY = 0x5b;
const CLOSE_ARRAY = 0x5d;
const COMMA = 0x2c;
const COLON = 0x3a;
const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const isSpace = (b: number) => b === 0x20 || b === 0x0a || b === 0x0d || b === 0x09;
const malformed = () => new RunnerDepotError("INTERNAL", "a stored manifest is not the JSON it should be");

/**
 * Pulls JSON tokens' bytes from a blob's chunks: finds where each value ends (strings and nesting) without parsing
 * what it skips. Structural bytes are ASCII, and UTF-8 never uses ASCII bytes inside a multi-byte character.
 */
class JsonScanner {
  private chunk: Uint8Array = new Uint8Array(0);
  private at = 0;
  /** The blob offset of `chunk[0]`. */
  private base: number;
  private readonly source: AsyncIterator<Uint8Array>;

  constructor(chunks: AsyncIterable<Uint8Array>, offset: number) {
    this.source = chunks[Symbol.asyncIterator]();
    this.base = offset;
  }

  /** The blob offset of the next byte. */
  get position(): number {
    return this.base + this.at;
  }

  /** Stops the reads. */
  async close(): Promise<void> {
    await this.source.return?.();
  }

  /** The next chunk that holds a byte: a store may hand out empty ones, and a read past one would see no byte. */
  private async fill(): Promise<void> {
    do {
      const next = await this.source.next();
      if (next.done) throw malformed();
      this.base += this.chunk.byteLength;
      this.chunk = next.value;
      this.at = 0;
    } while (this.chunk.byteLength === 0);
  }

  /** Skips white space, up to the next byte. */
  async skipSpace(): Promise<void> {
    for (;;) {
      while (this.at < this.chunk.byteLength) {
        if (!isSpace(this.chunk[this.at]!)) return;
        this.at++;
      }
      await this.fill();
    }
  }

  /** The next byte that is not white space, not consumed. */
  async peek(): Promise<number> {
    await this.skipSpace();
    return this.chunk[this.at]!;
  }

  /** Consumes the byte `peek` answered. */
  skipByte(): void {
    this.at++;
  }

  async expect(byte: number): Promise<void> {
    if ((await this.peek()) !== byte) throw malformed();
    this.at++;
  }

  /** Passes one value; its bytes when `keep`. */
  async value(keep: boolean): Promise<Buffer | null> {
    const first = await this.peek();
    const scalar = first !== QUOTE && first !== OPEN_OBJECT && first !== OPEN_ARRAY;
    const parts: Uint8Array[] = [];
    let from = this.at;
    let depth = 0;
    let inString = false;
    let escaped = false;
    for (;;) {
      if (this.at >= this.chunk.byteLength) {
        if (keep) parts.push(this.chunk.subarray(from));
        await this.fill();
        from = 0;
      }
      const b = this.chunk[this.at]!;
      if (inString) {
        this.at++;
        if (escaped) escaped = false;
        else if (b === BACKSLASH) escaped = true;
        else if (b === QUOTE) {
          inString = false;
          if (depth === 0) break;
        }
      } else if (scalar) {
        if (b === COMMA || b === CLOSE_OBJECT || b === CLOSE_ARRAY || isSpace(b)) break;
        this.at++;
      } else {
        this.at++;
        if (b === QUOTE) inString = true;
        else if (b === OPEN_OBJECT || b === OPEN_ARRAY) depth++;
        else if ((b === CLOSE_OBJECT || b === CLOSE_ARRAY) && --depth === 0) break;
      }
    }
    if (!keep) return null;
    parts.push(this.chunk.subarray(from, this.at));
    return Buffer.concat(parts);
  }
}

/** A blob's bytes from `from` to its end, read in ranges that double from `window`: stopping early reads no more. */
async function* ranges(
  store: PackageStore,
  digest: string,
  from: number,
  size: number,
  window: number,
): AsyncGenerator<Uint8Array> {
  window = Math.min(Math.max(window, FIRST_WINDOW), LAST_WINDOW);
  for (let at = from; at < size; at += window, window = Math.min(window * 2, LAST_WINDOW)) {
    const body = await store.getBlob(digest, { start: at, end: Math.min(at + window, size) - 1 });
    if (!body) throw new RunnerDepotError("INTERNAL", `Manifest blob ${digest} is missing`);
    yield* body;
  }
}

async function readRange(store: PackageStore, digest: string, from: number, to: number): Promise<Buffer> {
  if (to <= from) return Buffer.alloc(0);
  const body = await store.getBlob(digest, { start: from, end: to - 1 });
  if (!body) throw new RunnerDepotError("INTERNAL", `Manifest blob ${digest} is missing`);
  const parts: Uint8Array[] = [];
  for await (const chunk of body) parts.push(chunk);
  return Buffer.concat(parts);
}

/** The JSON answer of a summary page, with `Link: <…?after=…>; rel="next"` when there is more. */
export function pagedJson(request: Request, next: string | null, body: unknown): Response {
  const headers: Record<string, string> = { "Content-Type": "application/json", "Cache-Control": "no-store" };
  if (next !== null) {
    const url = new URL(request.url);
    url.searchParams.set("after", next);
    // Relative to the request's own path: the Host header is never reflected.
    headers.Link = `<${url.pathname}${url.search}>; rel="next"`;
  }
  return new Response(JSON.stringify(body), { status: 200, headers });
}
