/**
 * Depot at scale (issue 8): per-package read latency at 50, 10,000 and 100,000 packages;
 * GET /catalog 304, a page of 1,000 and ?since with 10 changes at 100,000 packages against
 * a request that touches no store; publishes per second of one-file packages at concurrency
 * 1, 8 and 32, with the store writes (and the WAL flushes the fs store waits for) each publish costs. Same run
 * on the fs store (fsync on) and on PostgreSQL records + S3 blobs (s3rver).
 *
 * Seeding: one real publish through HTTP makes a template version (its archive and manifest
 * blobs); every seeded package then gets the records a commit writes for it through the
 * calls a commit makes (test/fixtures/depot-seed.ts): its version record (create-only),
 * `publishVersion` (package record, change-sequence entry) and `compactAfter` (the pack
 * and catalog page of each shard it fills). Transaction records are not written (a commit
 * drops its working records). The fs store is seeded with fsync off (same files) and
 * measured with fsync on.
 */
import { PutObjectCommand } from "@aws-sdk/client-s3";
import { performance } from "node:perf_hooks";
import { createFsStore } from "../src/adapters/fs/store.js";
import { createPostgresRecords } from "../src/adapters/postgres/index.js";
import { createS3BlobStore } from "../src/adapters/s3/index.js";
import { HEAD_STALE_MS } from "../src/depot/catalog/head.js";
import { composeStore } from "../src/depot/store/compose.js";
import type { PackageStore } from "../src/depot/ports.js";
import { keys, type VersionRecord } from "../src/depot/store/records.js";
import pg from "pg";
import { createTestSchema, POSTGRES_URL, startS3 } from "../test/fixtures/backends.js";
import { publish, startDepot, tempDir, type LiveDepot } from "../test/fixtures/depot.js";
import { seedPackages } from "../test/fixtures/depot-seed.js";

/** Package counts measured; DEPOT_SCALE_LEVELS=50,500 for a quick trial of the module. */
const LEVELS = (process.env.DEPOT_SCALE_LEVELS ?? "50,10000,100000").split(",").map(Number);
const READS = 200;
const fmt = (n: number, digits = 2) => n.toFixed(digits);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const p99 = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.ceil(0.99 * xs.length) - 1)]!;
const name = (i: number) => `pkg-${String(i).padStart(6, "0")}`;

/** One kind of GET measured by {@link interleaved}. */
interface Target {
  url: () => string;
  status: number;
  headers?: Record<string, string>;
}

/**
 * Latencies of `n` GETs of each target (after 20 warm-up rounds), taken in turns (A, B, C,
 * A, B, C, …) so that a busy shared machine weighs on each target alike and their ratio
 * holds even while the absolute figures move.
 */
async function interleaved(targets: Target[], n: number): Promise<number[][]> {
  const out = targets.map(() => [] as number[]);
  for (let i = 0; i < n + 20; i++) {
    for (const [k, t] of targets.entries()) {
      const [ms] = await latencies(t.url, 1, t.status, t.headers, 0);
      if (i >= 20) out[k]!.push(ms!);
    }
  }
  return out;
}

/** Sequential latencies of `n` GETs (after `warm` warm-up ones), each expected to answer `status`. */
async function latencies(
  urls: () => string,
  n: number,
  status: number,
  headers: Record<string, string> = {},
  warm = 20,
): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n + warm; i++) {
    const start = performance.now();
    const response = await fetch(urls(), { headers });
    await response.arrayBuffer();
    if (response.status !== status) throw new Error(`${urls()}: ${response.status}, expected ${status}`);
    if (i >= warm) out.push(performance.now() - start);
  }
  return out;
}

/** A store wrapper counting writes, for the per-publish figures. */
function counting(inner: PackageStore): { store: PackageStore; counts: Record<string, number> } {
  const counts: Record<string, number> = {
    putRecord: 0,
    deleteRecord: 0,
    putBlob: 0,
    getRecord: 0,
    syncRecords: 0,
    lazyPut: 0,
    lazyDelete: 0,
    deferred: 0,
  };
  const store = Object.create(inner) as PackageStore;
  for (const method of ["putRecord", "deleteRecord", "putBlob", "getRecord", "syncRecords"]) {
    const own = (inner as unknown as Record<string, ((...a: unknown[]) => unknown) | undefined>)[method];
    if (!own) continue;
    const fn = own.bind(inner);
    (store as unknown as Record<string, unknown>)[method] = (...args: unknown[]) => {
      counts[method]!++;
      const cond = (method === "putRecord" ? args[2] : args[1]) as { lazy?: boolean; deferSync?: boolean } | undefined;
      if (method !== "getRecord" && method !== "syncRecords") {
        if (cond?.lazy) counts[method === "putRecord" ? "lazyPut" : "lazyDelete"]!++;
        // Flushed by the request's one syncRecords (depot/transactions/ordered-writes.ts), not on its own.
        else if (cond?.deferSync) counts.deferred!++;
      }
      return fn(...args);
    };
  }
  for (const method of [
    "getBlob",
    "statBlob",
    "deleteBlob",
    "listBlobs",
    "listRecords",
    "close",
    "signBlobUrl",
  ] as const) {
    const fn = (inner as unknown as Record<string, unknown>)[method];
    if (typeof fn === "function")
      (store as unknown as Record<string, unknown>)[method] = (fn as (...a: unknown[]) => unknown).bind(inner);
  }
  return { store, counts };
}

interface Backend {
  label: string;
  /** The store the depot serves (fsync on for fs). */
  serving: PackageStore;
  /** The store seeding writes through (fs: fsync off, same directory). */
  seeding: PackageStore;
  /** A fresh, empty store for the publish rounds, and 1 when a durable write waits for a flush (fs), else 0. */
  fresh(): Promise<PackageStore>;
  flushesPerWrite: number;
  close(): Promise<void>;
}

async function seed(store: PackageStore, template: VersionRecord, from: number, to: number): Promise<void> {
  await seedPackages(
    store,
    template,
    Array.from({ length: to - from }, (_, i) => name(from + i)),
  );
}

async function publishRate(depot: LiveDepot, concurrency: number, count: number, tag: string): Promise<number> {
  let next = 0;
  const start = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < count) {
        const i = next++;
        const response = await publish(depot.url, `rate-${tag}-${i}@1.0.0`, [
          { type: "file", path: "f", body: `${tag} ${i}\n` },
        ]);
        if (response.status !== 201) throw new Error(`publish: ${response.status} ${await response.text()}`);
        await response.arrayBuffer();
      }
    }),
  );
  return count / ((performance.now() - start) / 1000);
}

async function measure(backend: Backend): Promise<string[]> {
  const rows: string[] = [];
  const depot = await startDepot(backend.serving);
  try {
    // The template: one real publish of a 6-byte one-file package.
    const first = await publish(depot.url, `${name(0)}@1.0.0`, [{ type: "file", path: "hello", body: "hello\n" }]);
    if (first.status !== 201) throw new Error(`template publish: ${first.status}`);
    const template = (await backend.serving.getRecord<VersionRecord>(keys.version(name(0), "1.0.0")))!.value;
    let seeded = 1;
    const byLevel: Record<
      number,
      { version: number[]; data: number[]; none: number[]; seedS: number; seedRate: number }
    > = {};
    for (const level of LEVELS) {
      const t0 = performance.now();
      await seed(backend.seeding, template, seeded, level);
      const seedS = (performance.now() - t0) / 1000;
      const seedRate = (level - seeded) / seedS;
      seeded = level;
      console.error(`depot-scale ${backend.label}: seeded ${level} (${fmt(seedS, 0)} s)`);
      const pick = () => name(Math.floor(Math.random() * level));
      byLevel[level] = {
        ...(await interleaved(
          [
            { url: () => `${depot.url}/version/${pick()}`, status: 200 },
            { url: () => `${depot.url}/data/${pick()}@1.0.0`, status: 200 },
            { url: () => `${depot.url}/-/no-such-route`, status: 404 },
          ],
          READS,
        ).then(([version, data, none]) => ({ version: version!, data: data!, none: none! }))),
        seedS,
        seedRate,
      };
      const m = byLevel[level]!;
      console.error(
        `depot-scale ${backend.label} @${level}: version ${fmt(median(m.version))} ms, data ${fmt(median(m.data))} ms, no-store ${fmt(median(m.none))} ms, seeding ${fmt(seedRate, 0)}/s`,
      );
    }
    const base = byLevel[LEVELS[0]!]!;
    for (const level of LEVELS) {
      const at = byLevel[level]!;
      // Raw: median ÷ the base level's median. In parentheses: the same with each median first
      // divided by the no-store request's median of its own level (taken in turns with it).
      const ratio = (xs: number[], bs: number[]) =>
        `${fmt(median(xs) / median(bs))} (${fmt(median(xs) / median(at.none) / (median(bs) / median(base.none)))})`;
      rows.push(
        `| ${backend.label} | ${level.toLocaleString("en")} | ${fmt(median(at.version))} / ${fmt(p99(at.version))} | ${ratio(at.version, base.version)} | ${fmt(median(at.data))} / ${fmt(p99(at.data))} | ${ratio(at.data, base.data)} | ${fmt(median(at.none))} | ${fmt(at.seedS, 0)} s (${fmt(at.seedRate, 0)}/s) |`,
      );
    }
    // Catalog at 100,000 packages: 304, a page of 1,000, ?since with 10 changes, against a request touching no store.
    const head = (await (await fetch(`${depot.url}/catalog?limit=1`)).json()) as { position: number };
    await seed(backend.seeding, template, seeded, seeded + 10);
    // The seeding store is another instance (another process, as far as the router can
    // tell): on fs its held head moves within HEAD_STALE_MS (depot/catalog/head.ts).
    await new Promise((resolve) => setTimeout(resolve, HEAD_STALE_MS + 200));
    const etag = (await fetch(`${depot.url}/catalog?limit=1`)).headers.get("etag")!;
    // The page of 1,000 is measured on its own turns: its garbage (a 100 KB answer, page
    // records parsed) would otherwise land in the light requests' garbage-collection pauses.
    const [none, c304, since] = (await interleaved(
      [
        { url: () => `${depot.url}/-/no-such-route`, status: 404 },
        { url: () => `${depot.url}/catalog`, status: 304, headers: { "if-none-match": etag } },
        { url: () => `${depot.url}/catalog?since=${head.position}`, status: 200 },
      ],
      READS,
    )) as [number[], number[], number[]];
    const [, page] = (await interleaved(
      [
        { url: () => `${depot.url}/-/no-such-route`, status: 404 },
        {
          url: () =>
            `${depot.url}/catalog?limit=1000&after=c${Math.floor(Math.random() * Math.max(1, seeded - 1000)).toString(36)}`,
          status: 200,
        },
      ],
      100,
    )) as [number[], number[]];
    const catalogRows = [
      [`\`GET /catalog\` + \`If-None-Match\` → 304`, c304],
      [`\`GET /catalog?limit=1000\` (a page, random cursor)`, page],
      [`\`GET /catalog?since=\` (10 changes)`, since],
    ] as const;
    const catalog = catalogRows.map(
      ([what, xs]) =>
        `| ${backend.label} | ${what} | ${fmt(median(xs))} / ${fmt(p99(xs))} | ${fmt(median(none))} / ${fmt(p99(none))} | ${fmt(median(xs) / median(none))} |`,
    );
    rows.push("\u0000", ...catalog);
  } finally {
    await depot.close();
  }
  // Publishes per second on a fresh store, and what each publish writes.
  const { store, counts } = counting(await backend.fresh());
  const fresh = await startDepot(store);
  try {
    const rates: string[] = [];
    for (const [concurrency, count] of [
      [1, 20],
      [8, 80],
      [32, 128],
    ] as const) {
      rates.push(`${concurrency}: ${fmt(await publishRate(fresh, concurrency, count, `c${concurrency}`), 1)}/s`);
    }
    const before = { ...counts };
    await publishRate(fresh, 1, 10, "count");
    const per = (k: string) => (counts[k]! - before[k]!) / 10;
    // fs store (records.db, record-db.ts): every durable record write, durable delete and
    // blob write (a row up to 16 KiB, a file above) waits for a flush of the WAL (a file
    // blob for two fsyncs of its own instead), except deferred ones, which a request's one
    // syncRecords flushes together; concurrent writers share each flush, so the real count
    // is lower under concurrency: this is the most at concurrency 1.
    const flushCount =
      per("putRecord") +
      per("putBlob") +
      per("deleteRecord") -
      per("lazyPut") -
      per("lazyDelete") -
      per("deferred") +
      per("syncRecords");
    const fsyncs = backend.flushesPerWrite > 0 ? ` (at most ${fmt(flushCount, 0)} WAL flushes waited for)` : "";
    const deferred =
      per("deferred") > 0
        ? `, ${fmt(per("deferred"), 1)} of the writes deferred to ${fmt(per("syncRecords"), 1)} syncRecords`
        : "";
    rows.push(
      "\u0001",
      `| ${backend.label} | ${rates.join(", ")} | ${fmt(per("putRecord"), 1)} record writes (${fmt(per("lazyPut"), 1)} lazy), ${fmt(per("deleteRecord"), 1)} deletes (${fmt(per("lazyDelete"), 1)} lazy), ${fmt(per("putBlob"), 1)} blob writes${deferred}${fsyncs}, ${fmt(per("getRecord"), 1)} record reads |`,
    );
  } finally {
    await fresh.close();
    await store.close?.();
  }
  return rows;
}

async function fsBackend(): Promise<Backend> {
  const tmp = await tempDir("bench-scale-fs-");
  const freshDirs: Array<() => Promise<void>> = [];
  return {
    label: "fs (fsync on)",
    serving: createFsStore(`${tmp.dir}/store`),
    seeding: createFsStore(`${tmp.dir}/store`, { unsafeNoSync: true }),
    async fresh() {
      const dir = await tempDir("bench-scale-fs-pub-");
      freshDirs.push(dir.cleanup);
      return createFsStore(dir.dir);
    },
    flushesPerWrite: 1,
    async close() {
      for (const c of freshDirs) await c();
      await tmp.cleanup();
    },
  };
}

async function pgBackend(): Promise<Backend> {
  const s3 = await startS3();
  const dbs = [await createTestSchema(), await createTestSchema()];
  const open = (db: (typeof dbs)[number], prefix: string) =>
    composeStore({
      blobs: createS3BlobStore({ bucket: s3.bucket, prefix, clientConfig: s3.clientConfig }),
      records: createPostgresRecords({ pool: db.pool, schema: db.schema }),
    });
  // s3rver removes a folder when its last object goes, racing uploads creating a file in it:
  // a resident object keeps each tmp/ folder alive.
  for (const prefix of ["scale/", "publish/"])
    await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `${prefix}tmp/.keep`, Body: "" }));
  const serving = open(dbs[0]!, "scale/");
  // Seeding writes the same rows through its own pool with synchronous_commit off (the
  // counterpart of the fs store's fsync off for seeding): 4 commits per package would
  // otherwise each wait for a WAL flush. Served and measured with the default (on).
  const seedPool = new pg.Pool({ connectionString: POSTGRES_URL, max: 32, options: "-c synchronous_commit=off" });
  seedPool.on("error", () => {});
  const seeding = composeStore({
    blobs: createS3BlobStore({ bucket: s3.bucket, prefix: "scale/", clientConfig: s3.clientConfig }),
    records: createPostgresRecords({ pool: seedPool, schema: dbs[0]!.schema }),
  });
  return {
    label: "PostgreSQL + S3",
    serving,
    seeding,
    async fresh() {
      return open(dbs[1]!, "publish/");
    },
    flushesPerWrite: 0,
    async close() {
      await seedPool.end();
      for (const db of dbs) await db.drop();
      await s3.close();
    },
  };
}

export async function run(): Promise<string> {
  const started = new Date();
  const sections: string[][] = [];
  // DEPOT_SCALE_BACKENDS=fs (or pg) runs one of them only.
  const only = process.env.DEPOT_SCALE_BACKENDS;
  for (const make of [fsBackend, pgBackend].filter((_, i) => !only || only === ["fs", "pg"][i])) {
    const backend = await make();
    try {
      sections.push(await measure(backend));
    } finally {
      await backend.close();
    }
  }
  const part = (i: number) =>
    sections.flatMap((rows) => {
      const cuts = [rows.indexOf("\u0000"), rows.indexOf("\u0001")];
      return i === 0 ? rows.slice(0, cuts[0]) : i === 1 ? rows.slice(cuts[0]! + 1, cuts[1]) : rows.slice(cuts[1]! + 1);
    });
  const minutes = (Date.now() - started.getTime()) / 60_000;
  return [
    "## Depot at scale",
    "",
    `Method: the depot (\`createPackageRouter\` + \`servePackageRouter\`, in the bench process) over the fs store (fsync on) and over PostgreSQL records + S3 blobs (s3rver, in-process, presigned redirects followed by \`fetch\`), driven by real \`fetch\` on loopback. Packages are seeded through the calls a commit makes once its archive is built (test/fixtures/depot-seed.ts: version record, \`publishVersion\`: package record and change-sequence entry, \`compactAfter\`: the pack and catalog page of each full shard of 1,000 positions), 32 at a time, after one real publish that makes the template archive; the fs store is seeded with fsync off and served with it on. Latencies: ${READS} sequential requests (after 20 warm-up ones) for random packages, median / p99 in ms, taken in turns with a request through the same router that touches no store (\`GET /-/no-such-route\` → 404) so load weighs on both alike; ratio = median ÷ the ${LEVELS[0]}-package median, and in parentheses the same after dividing each by its level's no-store median. The catalog rows are at the largest count (+10 changes), taken in turns with the no-store request, their peer. Publishes: one-file packages through HTTP (open, add, commit) on a fresh store. The machine is shared (2 cores, other agents' work running); whole module ${fmt(minutes, 1)} min.`,
    "",
    "| store | packages | `GET /version/<name>` ms (median / p99) | ratio (load-corrected) | `GET /data/<name>@1.0.0` ms (median / p99) | ratio (load-corrected) | no-store request ms (median) | seeding |",
    "|---|---:|---:|---:|---:|---:|---:|---:|",
    ...part(0),
    "",
    `| store | request at ${LEVELS.at(-1)!.toLocaleString("en")} packages | ms (median / p99) | peer: no store ms (median / p99) | ratio (median) |`,
    "|---|---|---:|---:|---:|",
    ...part(1),
    "",
    "| store | publishes/s at concurrency 1, 8, 32 | store calls per publish |",
    "|---|---|---|",
    ...part(2),
  ].join("\n");
}
