/**
 * Mirror and retention (issue 27): the first mirror of MIRROR_PACKAGES packages (default 10,000, one version each, a
 * 4 KiB file of its own) against curl copying the same archives; an incremental mirror after 100 new versions,
 * bytes on the wire against the new bytes; a retention pass at RETENTION_PACKAGES packages (default 100,000) against a
 * plain walk that reads every package record once.
 *
 * The upstream is `servePackageRouter` over an fs store in a child process (test/fixtures/depot-client-server.ts),
 * behind a TCP proxy in this process that counts every byte both ways (request and answer headers, bodies): the
 * mirror and curl both go through it. Versions are seeded as a commit writes them once its archive is built (the
 * item and manifest blobs, the archive hashed, the version record, `publishVersion`), so each has its own archive.
 */
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { createFsStore } from "../src/adapters/fs/store.js";
import { compactAfter } from "../src/depot/catalog/pages.js";
import { publishVersion } from "../src/depot/catalog/packages.js";
import { mirrorDepot } from "../src/depot/mirror/mirror.js";
import { commitArchive, type PackageManifest } from "../src/depot/package/archive.js";
import type { PackageStore } from "../src/depot/ports.js";
import { keys, mapLimit, type VersionRecord } from "../src/depot/store/records.js";
import { runRetention } from "../src/depot/store/retention.js";
import { seedPackages } from "../test/fixtures/depot-seed.js";
import { publish } from "../test/fixtures/depot.js";
import { startDepot, stop } from "./children.js";

const run$ = promisify(execFile);
const MIRROR_PACKAGES = Number(process.env.MIRROR_PACKAGES) || 10_000;
const RETENTION_PACKAGES = Number(process.env.RETENTION_PACKAGES) || 100_000;
/** Packages of the retention store that get a second version (the pass removes their first). */
const RETENTION_SECOND = 1_000;
const NEW_VERSIONS = 100;
const FILE = 4096;
const name = (i: number) => `pkg-${String(i).padStart(6, "0")}`;
const fmt = (n: number, digits = 0) => n.toFixed(digits);

/** A proxy that counts bytes both ways. */
async function countingProxy(port: number) {
  let bytes = 0;
  const server = net.createServer((client) => {
    const upstream = net.connect(port, "127.0.0.1");
    // No Nagle on either leg: a small request would otherwise wait for a delayed ACK (40 ms) at each hop.
    client.setNoDelay(true);
    upstream.setNoDelay(true);
    client.on("data", (chunk: Buffer) => void (bytes += chunk.length));
    upstream.on("data", (chunk: Buffer) => void (bytes += chunk.length));
    client.pipe(upstream).on("error", () => undefined);
    upstream.pipe(client).on("error", () => undefined);
    client.on("error", () => upstream.destroy());
    upstream.on("error", () => client.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    take: () => {
      const taken = bytes;
      bytes = 0;
      return taken;
    },
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

async function* once(bytes: Buffer): AsyncGenerator<Uint8Array> {
  yield bytes;
}

/** Publishes `name@version` with one file of its own, as a commit writes it once its archive is built. */
async function seedVersion(store: PackageStore, pkg: string, version: string, at: Date): Promise<void> {
  const body = randomBytes(FILE);
  const item = await store.putBlob(once(body));
  const mtime = Math.floor(at.getTime() / 1000);
  const manifest: PackageManifest = {
    name: pkg,
    version,
    publishedAt: new Date(mtime * 1000).toISOString(),
    attributes: {},
    requires: [],
    licenses: [],
    items: [{ path: "data.bin", type: "file", mode: 0o644, size: FILE, digest: item.digest }],
  };
  const json = Buffer.from(JSON.stringify(manifest));
  const [manifestBlob, archive] = await Promise.all([
    store.putBlob(once(json)),
    commitArchive(store, manifest, mtime, json),
  ]);
  const record: VersionRecord = {
    name: pkg,
    version,
    publishedAt: manifest.publishedAt,
    mtime,
    digest: archive.digest,
    size: archive.size,
    manifest: manifestBlob.digest,
    itemCount: 1,
    attributes: {},
    requires: [],
    transaction: `seed-${pkg}`,
  };
  await store.putRecord(keys.version(pkg, version), record, { ifRevision: null });
  await compactAfter(store, await publishVersion(store, pkg, version, at));
}

async function timed<T>(fn: () => Promise<T>): Promise<{ ms: number; value: T }> {
  const start = performance.now();
  const value = await fn();
  return { ms: performance.now() - start, value };
}

/** Counts the record reads a pass makes. */
function countingStore(store: PackageStore) {
  const counts = { reads: 0, listings: 0 };
  const counted = Object.create(store) as PackageStore;
  counted.getRecord = (key) => (counts.reads++, store.getRecord(key));
  counted.listRecords = (prefix, page) => (counts.listings++, store.listRecords(prefix, page));
  return { store: counted, counts };
}

async function mirrorRows(work: string): Promise<{ rows: string[]; notes: string[] }> {
  const upDir = path.join(work, "up");
  const seedStore = createFsStore(upDir, { unsafeNoSync: true });
  const seeded = await timed(() =>
    mapLimit(
      Array.from({ length: MIRROR_PACKAGES }, (_, i) => name(i)),
      16,
      (pkg) => seedVersion(seedStore, pkg, "1.0.0", new Date()),
    ),
  );
  await seedStore.close?.();
  const server = await startDepot(upDir, { noSync: true });
  const proxy = await countingProxy(Number(new URL(server.url).port));
  const rows: string[] = [];
  try {
    const archiveBytes =
      MIRROR_PACKAGES * (await (await fetch(`${server.url}/data/${name(0)}@1.0.0`)).arrayBuffer()).byteLength;

    // curl: every archive, one process, one connection reused, sequentially.
    const curlDir = path.join(work, "curl");
    const config = path.join(work, "curl.cfg");
    await writeFile(
      config,
      Array.from(
        { length: MIRROR_PACKAGES },
        (_, i) => `url = "${proxy.url}/data/${name(i)}@1.0.0"\noutput = "${curlDir}/${name(i)}.tar"\n`,
      ).join(""),
    );
    proxy.take();
    const curl = await timed(() => run$("curl", ["-sf", "--create-dirs", "-K", config], { maxBuffer: 1 << 20 }));
    const curlBytes = proxy.take();

    const local = createFsStore(path.join(work, "down"), { unsafeNoSync: true });
    const first = await timed(() => mirrorDepot(local, { upstream: proxy.url }));
    const firstBytes = proxy.take();
    rows.push(
      `| first mirror of ${MIRROR_PACKAGES.toLocaleString("en")} packages (\`mirrorDepot\`, fs store) | ${fmt(first.ms / 1000, 1)} s, ${fmt(firstBytes / 1e6, 1)} MB on the wire | curl, the same ${MIRROR_PACKAGES.toLocaleString("en")} archives (one connection) | ${fmt(curl.ms / 1000, 1)} s, ${fmt(curlBytes / 1e6, 1)} MB on the wire | ${fmt(first.ms / curl.ms, 2)} (time), ${fmt(firstBytes / curlBytes, 2)} (bytes) | — |`,
    );

    // 100 new versions, published through HTTP, then an incremental mirror.
    for (let i = 0; i < NEW_VERSIONS; i++) {
      const response = await publish(server.url, `${name(i)}@1.0.1`, [
        { type: "file", path: "data.bin", body: randomBytes(FILE) },
      ]);
      if (response.status !== 201) throw new Error(`publish: ${response.status}`);
    }
    proxy.take();
    const again = await timed(() => mirrorDepot(local, { upstream: proxy.url }));
    const againBytes = proxy.take();
    const newBytes = NEW_VERSIONS * FILE;
    rows.push(
      `| incremental mirror after ${NEW_VERSIONS} new versions of ${FILE} B each | ${againBytes.toLocaleString("en")} B on the wire (${again.value.bytesFetched.toLocaleString("en")} B of item bytes), ${fmt(again.ms)} ms | the new bytes | ${newBytes.toLocaleString("en")} B | ${fmt(againBytes / newBytes, 3)} | ≤ 1.05 |`,
    );
    await local.close?.();
    return {
      rows,
      notes: [
        `seeding ${MIRROR_PACKAGES.toLocaleString("en")} versions took ${fmt(seeded.ms / 1000, 1)} s; each archive is ${fmt(archiveBytes / MIRROR_PACKAGES)} B`,
        `the first mirror copied ${first.value.copied} versions, the incremental one ${again.value.copied}`,
      ],
    };
  } finally {
    await proxy.close();
    await stop(server.child);
  }
}

async function retentionRow(work: string): Promise<{ rows: string[]; notes: string[] }> {
  const store = createFsStore(path.join(work, "retention"), { unsafeNoSync: true });
  try {
    const at = new Date(Date.now() - 3600_000);
    await seedVersion(store, "template", "1.0.0", at);
    const template = (await store.getRecord<VersionRecord>(keys.version("template", "1.0.0")))!.value;
    const names = Array.from({ length: RETENTION_PACKAGES }, (_, i) => name(i));
    const seeded = await timed(async () => {
      await seedPackages(store, template, names, "1.0.0", 32);
      await seedPackages(store, template, names.slice(0, RETENTION_SECOND), "1.0.1", 32);
    });
    // The peer: every package record read once, paged as retention pages (the least any pass over them costs).
    const walk = await timed(async () => {
      let cursor: string | undefined;
      let n = 0;
      do {
        const page = await store.listRecords("pkg/", { cursor, limit: 1000 });
        cursor = page.cursor;
        await mapLimit(page.keys, 16, async (key) => void (await store.getRecord(key), n++));
      } while (cursor !== undefined);
      return n;
    });
    const rssBefore = process.memoryUsage().rss;
    const dry = countingStore(store);
    const plan = await timed(() => runRetention(dry.store, { keepLast: 1 }, { dryRun: true }));
    const rssAfter = process.memoryUsage().rss;
    const real = await timed(() => runRetention(store, { keepLast: 1 }));
    return {
      rows: [
        `| retention dry run, keep-last 1, ${(RETENTION_PACKAGES + 1).toLocaleString("en")} packages (${plan.value.removed.length.toLocaleString("en")} versions to remove) | ${fmt(plan.ms / 1000, 1)} s, ${dry.counts.reads.toLocaleString("en")} record reads in ${dry.counts.listings.toLocaleString("en")} listings | a walk reading every package record once | ${fmt(walk.ms / 1000, 1)} s, ${walk.value.toLocaleString("en")} reads | ${fmt(plan.ms / walk.ms, 2)} | — |`,
        `| retention real run, the same policy (removes ${real.value.removed.length.toLocaleString("en")} versions through the feed) | ${fmt(real.ms / 1000, 1)} s | the same walk | ${fmt(walk.ms / 1000, 1)} s | ${fmt(real.ms / walk.ms, 2)} | — |`,
      ],
      notes: [
        `seeding the retention store took ${fmt(seeded.ms / 1000, 1)} s; resident memory grew by ${fmt((rssAfter - rssBefore) / 2 ** 20, 1)} MiB over the dry run`,
      ],
    };
  } finally {
    await store.close?.();
  }
}

export async function run(): Promise<string> {
  const work = await mkdtemp(path.join(os.tmpdir(), "bench-mirror-"));
  const loadBefore = os.loadavg()[0]!;
  const started = performance.now();
  try {
    const mirror = await mirrorRows(work);
    const retention = await retentionRow(work);
    const minutes = (performance.now() - started) / 60_000;
    const curlVersion = (await run$("curl", ["--version"])).stdout.split(" ")[1];
    return [
      "## Depot: mirror and retention",
      "",
      `Method: the upstream is \`servePackageRouter\` over an fs store (fsync off) in a child process, behind a TCP proxy in the bench process that counts every byte both ways (headers and bodies); the mirror (\`mirrorDepot\`, this process, into an fs store with fsync off) and curl ${curlVersion} (\`-K\` with every URL: one process, one connection, sequential) both go through it. Each seeded version has one 4,096-byte file of its own and its own archive, written as a commit writes them once the archive is built. The incremental row publishes ${NEW_VERSIONS} new versions through HTTP, then mirrors again; its aim is the issue's (bytes moved ≤ 1.05 × the new bytes). The retention store is seeded with \`test/fixtures/depot-seed.ts\` (one template archive), ${RETENTION_SECOND.toLocaleString("en")} of its packages with a second version; the peer of its rows is a walk that lists \`pkg/\` in pages of 1,000 and reads each package record once (16 at a time, as retention does). ${os.cpus().length} cores, shared with other work; 1-minute load average ${fmt(loadBefore, 1)} before, ${fmt(os.loadavg()[0]!, 1)} after (times are noisy); whole module ${fmt(minutes, 1)} min.`,
      "",
      "| operation | runner-depot | peer | peer | ratio | aim |",
      "|---|---|---|---|---:|---|",
      ...mirror.rows,
      ...retention.rows,
      "",
      ...[...mirror.notes, ...retention.notes].map((n) => `- ${n[0]!.toUpperCase()}${n.slice(1)}.`),
    ].join("\n");
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}
