/**
 * The work of the batch mirror routes and of a committed transaction's summary page, counted through a store that
 * wraps the real fs store (its blob reads and bytes), on a real server and real fetch:
 * - `POST /mirror/blobs` reads each version's manifest once however many spellings name it (`x@1.0.0+N`), and
 *   refuses more distinct versions than a feed page holds before reading anything;
 * - `GET /mirror/feed` reads only the manifests its 8 MiB answer carries, in feed order (a smaller one past a
 *   left-out one still fits), the others readable from the next page;
 * - `GET /summary/<id>` of a committed transaction reads the same bytes for `limit=1` whether the version holds 10
 *   items or 1,000, and walking its pages along `next` reads about the manifest once, not once a page;
 * - and, on a memory store, pageOfCommitted's pages equal slices of the parsed manifest for any JSON layout.
 */
import { createHash } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { createMemoryStore } from "../../../src/adapters/memory/store.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import type { ManifestItem, ManifestLicense } from "../../../src/depot/package/archive.js";
import { keys, type VersionRecord } from "../../../src/depot/store/records.js";
import { pageOfCommitted, type ManifestHint } from "../../../src/depot/transactions/summary.js";
import { seedPackages } from "../../fixtures/depot-seed.js";
import { add, openTransaction, publish, startDepot, tempDir, type LiveDepot } from "../../fixtures/depot.js";

const digestOf = (text: string) => `sha256:${createHash("sha256").update(text).digest("hex")}`;

/** The fs store with its blob reads counted: calls and bytes, per digest. */
function countingStore(inner: PackageStore) {
  const calls = new Map<string, number>();
  const bytes = new Map<string, number>();
  const store: PackageStore = new Proxy(inner, {
    get(target, prop, receiver) {
      const v = Reflect.get(target, prop, receiver) as unknown;
      if (prop !== "getBlob" || typeof v !== "function") return typeof v === "function" ? v.bind(target) : v;
      return async (digest: string, ...rest: unknown[]) => {
        calls.set(digest, (calls.get(digest) ?? 0) + 1);
        const body = (await (v as (...a: unknown[]) => Promise<AsyncIterable<Uint8Array> | null>).apply(target, [
          digest,
          ...rest,
        ])) as AsyncIterable<Uint8Array> | null;
        if (!body) return body;
        return (async function* () {
          for await (const c of body) {
            bytes.set(digest, (bytes.get(digest) ?? 0) + c.byteLength);
            yield c;
          }
        })();
      };
    },
  });
  const sum = (m: Map<string, number>, digest?: string) =>
    digest === undefined ? [...m.values()].reduce((a, b) => a + b, 0) : (m.get(digest) ?? 0);
  return {
    store,
    calls: (digest?: string) => sum(calls, digest),
    bytes: (digest?: string) => sum(bytes, digest),
    reset: () => (calls.clear(), bytes.clear()),
  };
}

const cleanups: Array<() => Promise<unknown>> = [];
let inner: PackageStore;
let counted: ReturnType<typeof countingStore>;
let depot: LiveDepot;

beforeAll(async () => {
  const tmp = await tempDir("mirror-summary-bounds-");
  cleanups.push(tmp.cleanup);
  inner = createFsStore(tmp.dir, { unsafeNoSync: true });
  cleanups.push(async () => inner.close?.());
  counted = countingStore(inner);
  depot = await startDepot(counted.store);
  cleanups.push(() => depot.close());
});
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

const version = async (name: string, v = "1.0.0") =>
  (await inner.getRecord<VersionRecord>(keys.version(name, v)))!.value;

/** Publishes `name@1.0.0` with `count` directories of ~`pathBytes`-byte paths, a licence and a file; its id. */
async function publishMany(name: string, count: number, pathBytes: number): Promise<string> {
  const id = await openTransaction(depot.url, `${name}@1.0.0`);
  const seg = "s".repeat(Math.min(200, pathBytes));
  const segs = Math.max(1, Math.round(pathBytes / (seg.length + 1)));
  const paths = Array.from(
    { length: count },
    (_, i) => `d${String(i).padStart(4, "0")}/${Array(segs).fill(seg).join("/")}`,
  );
  for (let i = 0; i < paths.length; i += 16)
    await Promise.all(paths.slice(i, i + 16).map((p) => add(depot.url, id, { type: "dir", path: p })));
  for (const a of [
    { type: "file", path: "f", body: "abc" },
    { type: "license", name: "MIT", body: "MIT licence text" },
    { type: "set", attrs: { description: "a package of many items" } },
  ] as const)
    expect((await add(depot.url, id, a)).status).toBe(201);
  expect((await fetch(`${depot.url}/commit/${id}`, { method: "POST" })).status).toBe(201);
  return id;
}

describe("POST /mirror/blobs: one manifest read per version", () => {
  it("reads a version's manifest once for 1,000 build-metadata spellings of it, and answers every blob", async () => {
    expect((await publish(depot.url, "meta@1.0.0", [{ type: "file", path: "f", body: "abc" }])).status).toBe(201);
    const manifest = (await version("meta")).manifest;
    counted.reset();
    const blobs = Array.from({ length: 1000 }, (_, i) => [`meta@1.0.0+${i}`, digestOf("abc")]);
    const r = await fetch(`${depot.url}/mirror/blobs`, { method: "POST", body: JSON.stringify({ blobs }) });
    expect(r.status).toBe(200);
    expect(Buffer.from(await r.arrayBuffer()).toString()).toBe("abc".repeat(1000));
    expect(counted.calls(manifest)).toBe(1);
  });

  it("refuses more distinct versions than a feed page before reading anything", async () => {
    counted.reset();
    const blobs = Array.from({ length: 101 }, (_, i) => [`nope${i}@1.0.0`, digestOf("abc")]);
    const r = await fetch(`${depot.url}/mirror/blobs`, { method: "POST", body: JSON.stringify({ blobs }) });
    expect(r.status).toBe(400);
    expect(((await r.json()) as { detail?: string }).detail ?? "").toMatch(/at most 100 versions/);
    expect(counted.calls()).toBe(0);
    // 100 distinct versions are within bounds (404: none is published).
    const hundred = blobs.slice(0, 100);
    const ok = await fetch(`${depot.url}/mirror/blobs`, { method: "POST", body: JSON.stringify({ blobs: hundred }) });
    expect(ok.status).toBe(404);
  });
});

describe("GET /mirror/feed: only the manifests the answer carries are read", () => {
  it("reads at most the 8 MiB budget of manifests, in feed order, and the next page carries the rest", async () => {
    expect((await publish(depot.url, "tmpl@1.0.0", [{ type: "file", path: "f", body: "abc" }])).status).toBe(201);
    const template = await version("tmpl");
    // A 3 MiB manifest shared by 20 versions, then one small one: 2 big ones fit in 8 MiB, the small one too.
    const big = JSON.stringify({ name: "x", pad: "p".repeat(3 * 2 ** 20) });
    const bigBlob = await inner.putBlob(
      (async function* () {
        yield Buffer.from(big);
      })(),
    );
    const bigs = Array.from({ length: 20 }, (_, i) => `big${String(i).padStart(2, "0")}`);
    for (const name of bigs) await seedPackages(counted.store, { ...template, manifest: bigBlob.digest }, [name]);
    await seedPackages(counted.store, template, ["small"]);
    counted.reset();
    type Page = {
      position: number;
      more: boolean;
      changes: Array<{ position: number; name: string }>;
      versions: Record<string, { manifest: string }>;
    };
    // The first read of the head here (it is held from then on): every entry so far is on this page.
    const first = (await (await fetch(`${depot.url}/mirror/feed?since=0`)).json()) as Page;
    const ours = (names: string[]) => names.filter((n) => /^(big|small)/.test(n));
    expect(ours(first.changes.map((c) => c.name))).toEqual([...bigs, "small"]);
    expect(ours(Object.keys(first.versions))).toEqual(["big00@1.0.0", "big01@1.0.0", "small@1.0.0"]);
    expect(first.versions["big00@1.0.0"]!.manifest).toBe(big);
    expect(first.more).toBe(false);
    // Before: all 20 big manifests read (60 MiB) to answer 2 of them.
    expect(counted.bytes(bigBlob.digest)).toBe(2 * big.length);
    expect(counted.bytes()).toBeLessThanOrEqual(8 * 2 ** 20);
    // The versions left out are carried by a page starting after the last one carried.
    const after = first.changes.find((c) => c.name === "big01")!.position;
    const next = (await (await fetch(`${depot.url}/mirror/feed?since=${after}`)).json()) as Page;
    expect(Object.keys(next.versions)).toEqual(["big02@1.0.0", "big03@1.0.0", "small@1.0.0"]);
  });
});

describe("GET /summary/<id> of a committed transaction: one page costs O(limit)", () => {
  let small: string;
  let large: string;
  beforeAll(async () => {
    small = await publishMany("few", 10, 2500);
    large = await publishMany("many", 1000, 2500);
  }, 120_000);

  const wholeManifest = async (name: string) => {
    const body = (await inner.getBlob((await version(name)).manifest))!;
    const parts: Buffer[] = [];
    for await (const c of body) parts.push(Buffer.from(c));
    return JSON.parse(Buffer.concat(parts).toString()) as { items: ManifestItem[]; licenses: ManifestLicense[] };
  };
  type Summary = { state: string; items: ManifestItem[]; next: string | null; licenses: ManifestLicense[] };

  it("reads the same bytes for limit=1 with 10 items or 1,000", async () => {
    const read = async (id: string) => {
      counted.reset();
      const r = await fetch(`${depot.url}/summary/${id}?limit=1`);
      const body = (await r.json()) as Summary;
      expect(body).toMatchObject({ state: "committed", next: "1" });
      expect(body.items).toHaveLength(1);
      expect(body.licenses.map((l) => l.name)).toEqual(["MIT"]);
      return counted.bytes();
    };
    const few = await read(small);
    const many = await read(large);
    const manifestBytes = (await inner.statBlob((await version("many")).manifest))!.size;
    expect(manifestBytes).toBeGreaterThan(2_000_000);
    // Before: the whole manifest (~2.5 MB here; 25 KB for 10 items) for one item.
    expect(many).toBeLessThanOrEqual(few);
    expect(many).toBeLessThan(64 * 1024);
  });

  it("walks the pages along next with the same answers as slicing the manifest, reading it about once", async () => {
    const manifest = await wholeManifest("many");
    const digest = (await version("many")).manifest;
    const size = (await inner.statBlob(digest))!.size;
    counted.reset();
    let url: string | null = `/summary/${large}?limit=100`;
    const walked: ManifestItem[] = [];
    let pages = 0;
    for (; url !== null; pages++) {
      const r: Response = await fetch(`${depot.url}${url}`);
      const body = (await r.json()) as Summary;
      const start = pages * 100;
      expect(body.items).toEqual(manifest.items.slice(start, start + 100));
      expect(body.licenses).toEqual(manifest.licenses);
      const more = start + 100 < manifest.items.length;
      expect(body.next).toBe(more ? String(start + 100) : null);
      walked.push(...body.items);
      url = /^<([^>]+)>; rel="next"$/.exec(r.headers.get("link") ?? "")?.[1] ?? null;
      expect(url !== null).toBe(more);
    }
    expect(walked).toEqual(manifest.items);
    expect(pages).toBe(11); // 1,001 items
    // Before: every page read the whole manifest (11 × size); now each page its own items and the licences.
    expect(counted.bytes(digest)).toBeLessThan(1.5 * size);
  });

  it("answers a cursor this process holds no hint for (a fresh router) with the same page", async () => {
    const manifest = await wholeManifest("many");
    const fresh = await startDepot(inner);
    try {
      const r = await fetch(`${fresh.url}/summary/${large}?limit=7&after=500`);
      const body = (await r.json()) as Summary;
      expect(body.items).toEqual(manifest.items.slice(500, 507));
      expect(body.next).toBe("507");
      expect(body.licenses).toEqual(manifest.licenses);
      const past = (await (await fetch(`${fresh.url}/summary/${large}?after=5000`)).json()) as Summary;
      expect(past).toMatchObject({ items: [], next: null, licenses: manifest.licenses });
      expect((await fetch(`${fresh.url}/summary/${large}?after=${"a".repeat(64)}`)).status).toBe(400);
    } finally {
      await fresh.close();
    }
  });
});

describe("pageOfCommitted: the streamed pages equal slices of the parsed manifest", () => {
  it("for any JSON layout: white space, escapes and brackets in strings, multi-byte text, licences after items", async () => {
    const store = createMemoryStore();
    // Strings that would end a scan too early if escapes or strings were not followed, long enough that values
    // straddle the reads' ranges; pretty-printed, and with the licences last.
    const items: ManifestItem[] = Array.from({ length: 57 }, (_, i) => ({
      type: "link",
      path: `p${i}/\\"]},[{ é😀 ${"x".repeat(i * 37)}`,
      mode: 511,
      size: 0,
      target: `t\\\\"${"]".repeat(i)}`,
    }));
    const licenses: ManifestLicense[] = [{ name: "MIT", path: ".pkg/licenses/MIT", size: 3, digest: digestOf("MIT") }];
    const manifest = { name: "odd", attributes: { 'a"]': "}{" }, items, extra: [1, { b: [2] }], licenses };
    const text = JSON.stringify(manifest, null, 2);
    expect(Buffer.byteLength(text)).toBeGreaterThan(64 * 1024);
    const { digest } = await store.putBlob(
      (async function* () {
        yield Buffer.from(text);
      })(),
    );
    for (const limit of [1, 3, 10, 57, 100]) {
      for (const hints of [new Map<string, ManifestHint>(), undefined]) {
        const walked: ManifestItem[] = [];
        let after: string | undefined;
        for (let pages = 0; pages < 100; pages++) {
          const page = await pageOfCommitted(store, digest, { limit, after }, hints ?? new Map());
          expect(page!.licenses).toEqual(licenses);
          const start = after === undefined ? 0 : Number(after);
          expect(page!.items).toEqual(items.slice(start, start + limit));
          walked.push(...page!.items);
          if (page!.next === null) break;
          expect(page!.next).toBe(String(start + limit));
          after = page!.next;
        }
        expect(walked).toEqual(items);
      }
    }
    // Past the end, an empty items list, a missing blob.
    expect(await pageOfCommitted(store, digest, { limit: 5, after: "900" }, new Map())).toEqual({
      items: [],
      next: null,
      licenses,
    });
    const empty = await store.putBlob(
      (async function* () {
        yield Buffer.from('{"items":[],"licenses":[]}');
      })(),
    );
    expect(await pageOfCommitted(store, empty.digest, { limit: 5 }, new Map())).toEqual({
      items: [],
      next: null,
      licenses: [],
    });
    expect(await pageOfCommitted(store, digestOf("absent"), { limit: 5 }, new Map())).toBeNull();
  });
});
