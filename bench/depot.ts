/**
 * Depot benchmark: a 256 MiB file through the depot (fs store, servePackageRouter in a
 * child process, real fetch from this process) against `cp` of the same file on the same
 * disk and nginx serving it, all in one run; and GET /catalog latency (200 and 304) with
 * 10,000 packages in the store.
 */
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { createReadStream, createWriteStream, existsSync } from "node:fs";
import { mkdir, mkdtemp, open, rm, writeFile } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { createFsStore } from "../src/adapters/fs/store.js";
import { createDepotClient } from "../src/depot/client.js";
import { keys, type CatalogRecord } from "../src/depot/records.js";

const run$ = promisify(execFile);
const MiB = 2 ** 20;
const FILE_BYTES = 256 * MiB;
const PACKAGES = 10_000;
const here = path.dirname(fileURLToPath(import.meta.url));
const serverScript = path.join(here, "..", "test", "fixtures", "depot-client-server.ts");

const mbps = (bytes: number, ms: number) => bytes / 1e6 / (ms / 1000);
const fmt = (n: number, digits = 0) => n.toFixed(digits);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const percentile = (xs: number[], p: number) => {
  const sorted = [...xs].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
};

async function timed(fn: () => Promise<unknown>): Promise<number> {
  const start = performance.now();
  await fn();
  return performance.now() - start;
}

/** Median of `runs` timings, with `cleanup` between them (not timed). */
async function medianOf(runs: number, fn: () => Promise<unknown>, cleanup: () => Promise<unknown>): Promise<number> {
  const times: number[] = [];
  for (let i = 0; i < runs; i++) {
    times.push(await timed(fn));
    await cleanup();
  }
  return median(times);
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

async function waitForPort(port: number, child: ChildProcess): Promise<void> {
  for (let i = 0; i < 200; i++) {
    if (child.exitCode !== null) throw new Error(`process exited with ${child.exitCode}`);
    const ok = await new Promise<boolean>((resolve) => {
      const socket = net.connect(port, "127.0.0.1", () => {
        socket.end();
        resolve(true);
      });
      socket.once("error", () => resolve(false));
    });
    if (ok) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`nothing listens on 127.0.0.1:${port}`);
}

async function stop(child: ChildProcess | undefined): Promise<void> {
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGTERM");
  await exited;
}

/** Starts the depot fixture server (fs store in `dir`) in a child process. */
async function startDepot(dir: string): Promise<{ url: string; child: ChildProcess }> {
  const child = spawn(process.execPath, ["--import", "tsx", serverScript, dir], { stdio: ["pipe", "pipe", "inherit"] });
  const line = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).once("line", resolve);
    child.once("exit", (code) => reject(new Error(`depot server exited with ${code}`)));
  });
  return { url: (JSON.parse(line) as { url: string }).url, child };
}

async function ensureNginx(): Promise<string> {
  const bin = "/usr/sbin/nginx";
  if (existsSync(bin)) return bin;
  console.error("bench depot: installing nginx with apt-get…");
  const env = { ...process.env, DEBIAN_FRONTEND: "noninteractive" };
  await run$("apt-get", ["update"], { env, maxBuffer: 64 * MiB });
  await run$("apt-get", ["install", "-y", "--no-install-recommends", "nginx"], { env, maxBuffer: 64 * MiB });
  if (!existsSync(bin)) throw new Error("apt-get install nginx did not provide /usr/sbin/nginx");
  return bin;
}

/** nginx on 127.0.0.1 with a temp config and prefix, serving `root`; not a system service. */
async function startNginx(work: string, root: string): Promise<{ url: string; child: ChildProcess }> {
  const bin = await ensureNginx();
  const port = await freePort();
  const prefix = path.join(work, "nginx");
  await mkdir(path.join(prefix, "logs"), { recursive: true });
  const conf = path.join(prefix, "nginx.conf");
  const user = process.getuid?.() === 0 ? "user root;" : "";
  await writeFile(
    conf,
    `${user}
worker_processes 1;
daemon off;
master_process on;
pid ${prefix}/nginx.pid;
error_log ${prefix}/logs/error.log warn;
events { worker_connections 256; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 100000;
  default_type application/octet-stream;
  client_body_temp_path ${prefix}/body;
  proxy_temp_path ${prefix}/proxy;
  fastcgi_temp_path ${prefix}/fastcgi;
  uwsgi_temp_path ${prefix}/uwsgi;
  scgi_temp_path ${prefix}/scgi;
  server {
    listen 127.0.0.1:${port};
    root ${root};
  }
}
`,
  );
  const child = spawn(bin, ["-p", prefix, "-c", conf], { stdio: ["ignore", "inherit", "inherit"] });
  await waitForPort(port, child);
  return { url: `http://127.0.0.1:${port}`, child };
}

/** A plain streaming GET to a file: the same loop for the depot and for nginx. */
async function fetchToFile(url: string, file: string): Promise<number> {
  const response = await fetch(url);
  if (!response.ok || !response.body) throw new Error(`GET ${url}: ${response.status}`);
  await pipeline(Readable.fromWeb(response.body as never), createWriteStream(file));
  return Number(response.headers.get("content-length"));
}

async function makeFile(file: string, bytes: number): Promise<void> {
  const block = randomBytes(MiB);
  const fh = await open(file, "w");
  for (let i = 0; i < bytes / MiB; i++) {
    block.writeUInt32BE(i, 0);
    await fh.write(block);
  }
  await fh.close();
}

/** Stamps a new first word into the file, so each publish uploads new content. */
async function restamp(file: string, n: number): Promise<void> {
  const fh = await open(file, "r+");
  const b = Buffer.alloc(8);
  b.writeDoubleBE(n + Math.random());
  await fh.write(b, 0, 8, 0);
  await fh.close();
}

/** Latencies (ms) of `n` sequential GETs, after `warm` unmeasured ones. */
async function latencies(url: string, n: number, warm: number, headers: Record<string, string>, expect: number): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n + warm; i++) {
    const start = performance.now();
    const response = await fetch(url, { headers });
    await response.arrayBuffer();
    const ms = performance.now() - start;
    if (response.status !== expect) throw new Error(`GET ${url}: ${response.status}, expected ${expect}`);
    if (i >= warm) out.push(ms);
  }
  return out;
}

/** Runs the depot benchmark and returns its Markdown section. */
export async function run(): Promise<string> {
  const work = await mkdtemp(path.join(os.tmpdir(), "bench-depot-"));
  const children: ChildProcess[] = [];
  try {
    const source = path.join(work, "source.bin");
    const www = path.join(work, "www");
    await mkdir(www);
    await makeFile(source, FILE_BYTES);

    // cp of the same file on the same disk.
    const copy = path.join(work, "copy.bin");
    const cpMs = await medianOf(3, () => run$("cp", [source, copy]), () => rm(copy, { force: true }));

    // The depot: fs store (with fsync, its default), server in a child process.
    const depot = await startDepot(path.join(work, "store"));
    children.push(depot.child);
    const client = createDepotClient({ baseUrl: depot.url });

    // Upload: the bare POST /add of the file (one transaction, abandoned afterwards).
    const uploads: number[] = [];
    for (let i = 0; i < 3; i++) {
      await restamp(source, i);
      const opened = (await (await fetch(`${depot.url}/trans/rawup@1.0.${i}`, { method: "POST" })).json()) as { transaction: string };
      uploads.push(
        await timed(async () => {
          const response = await fetch(`${depot.url}/add/${opened.transaction}/file`, {
            method: "POST",
            headers: { "pkg-path": "big.bin" },
            body: Readable.toWeb(createReadStream(source, { highWaterMark: MiB })) as ReadableStream<Uint8Array>,
            duplex: "half",
          } as RequestInit);
          if (response.status !== 201) throw new Error(`upload: ${response.status} ${await response.text()}`);
          await response.arrayBuffer();
        }),
      );
      await fetch(`${depot.url}/trans/${opened.transaction}`, { method: "DELETE" });
    }
    const uploadMs = median(uploads);

    // Publish end to end with the client: hash, by-reference probe, upload, commit (archive build).
    await restamp(source, 99);
    const publishMs = await timed(() => client.publish({ name: "big", version: "1.0.0", items: [{ type: "file", path: "big.bin", file: source }] }));
    const info = (await client.versions("big")).versions[0]!;

    // Downloads: the depot's archive (256 MiB + 1.5 KiB of tar) and nginx serving the same archive bytes.
    const archive = path.join(www, "big.tar");
    await client.download("big@1.0.0", { to: archive });
    const out = path.join(work, "out.bin");
    const dropOut = () => rm(out, { force: true });
    const depotGetMs = await medianOf(3, () => fetchToFile(`${depot.url}/data/big@1.0.0`, out), dropOut);
    const clientGetMs = await medianOf(3, () => client.download("big@1.0.0", { to: out }), dropOut);
    const nginx = await startNginx(work, www);
    children.push(nginx.child);
    const nginxGetMs = await medianOf(3, () => fetchToFile(`${nginx.url}/big.tar`, out), dropOut);
    const cpArchiveMs = await medianOf(3, () => run$("cp", [archive, out]), dropOut);
    await stop(depot.child);

    // Catalog: 10,000 packages × 3 versions written straight into the catalog record (the
    // only record GET /catalog reads), after one real publish to initialise the store.
    const catalogDir = path.join(work, "catalog-store");
    const seedDepot = await startDepot(catalogDir);
    children.push(seedDepot.child);
    await createDepotClient({ baseUrl: seedDepot.url }).publish({ name: "pkg-00000", version: "1.0.0", items: [{ type: "file", path: "x", content: "x" }] });
    await stop(seedDepot.child);
    const seedStart = performance.now();
    const store = createFsStore(catalogDir);
    const current = await store.getRecord<CatalogRecord>(keys.catalog);
    const now = new Date().toISOString();
    const catalog: CatalogRecord = { packages: { ...current!.value.packages }, updatedAt: now };
    for (let i = 1; i < PACKAGES; i++) {
      catalog.packages[`pkg-${String(i).padStart(5, "0")}`] = { versions: ["1.0.0", "1.1.0", "2.0.0"], updatedAt: now };
    }
    if ((await store.putRecord(keys.catalog, catalog, { ifRevision: current!.revision })) === null) throw new Error("catalog seed lost a race");
    await store.close?.();
    const seedMs = performance.now() - seedStart;
    const catalogDepot = await startDepot(catalogDir);
    children.push(catalogDepot.child);
    const first = await fetch(`${catalogDepot.url}/catalog`);
    const body = await first.text();
    const etag = first.headers.get("etag")!;
    const parsed = JSON.parse(body) as { count: number };
    if (parsed.count !== PACKAGES) throw new Error(`catalog holds ${parsed.count} packages, expected ${PACKAGES}`);
    const N = 200;
    const l200 = await latencies(`${catalogDepot.url}/catalog`, N, 10, {}, 200);
    const l304 = await latencies(`${catalogDepot.url}/catalog`, N, 10, { "if-none-match": etag }, 304);
    await writeFile(path.join(www, "catalog.json"), body);
    const lNginx = await latencies(`${nginx.url}/catalog.json`, N, 10, {}, 200);
    await stop(catalogDepot.child);

    const bytes = FILE_BYTES;
    const rows = [
      ["upload: `POST /add` streamed (256 MiB)", mbps(bytes, uploadMs), "`cp` of the file", mbps(bytes, cpMs)],
      ["publish: `client.publish` (hash + probe + upload + commit)", mbps(bytes, publishMs), "`cp` of the file", mbps(bytes, cpMs)],
      ["download: `GET /data` to a file", mbps(info.size, depotGetMs), "nginx `GET` to a file (same loop)", mbps(info.size, nginxGetMs)],
      ["download: `client.download` (SHA-256 verified)", mbps(info.size, clientGetMs), "nginx `GET` to a file (same loop)", mbps(info.size, nginxGetMs)],
      ["download: `GET /data` to a file", mbps(info.size, depotGetMs), "`cp` of the archive", mbps(info.size, cpArchiveMs)],
    ] as const;
    const lat = [
      ["`GET /catalog` → 200", median(l200), percentile(l200, 99), "nginx, same JSON as a static file", median(lNginx), percentile(lNginx, 99)],
      ["`GET /catalog` + `If-None-Match` → 304", median(l304), percentile(l304, 99), "nginx, same JSON as a static file", median(lNginx), percentile(lNginx, 99)],
    ] as const;
    return [
      "## Depot",
      "",
      `Method: a ${FILE_BYTES / MiB} MiB file of random bytes on ${os.tmpdir()}; the depot is \`servePackageRouter\` over \`createFsStore\` (fsync on, its default) in a child process, driven by real \`fetch\` from the bench process; nginx ${await nginxVersion()} (one worker, sendfile, temp config on 127.0.0.1) serves the same archive bytes; \`cp\` copies on the same disk. Throughputs are the median of 3 runs (publish: 1 run), MB = 10⁶ bytes; ratio = depot ÷ peer. The catalog has ${PACKAGES.toLocaleString("en")} packages × 3 versions (${fmt(body.length / 1e6, 2)} MB of JSON), seeded by writing the depot's \`catalog\` record straight into the store (${fmt(seedMs)} ms), since committing 10,000 versions one by one rewrites that record each time; latencies are ${N} sequential requests after 10 warm-up ones.`,
      "",
      "| operation | depot MB/s | peer | peer MB/s | ratio |",
      "|---|---:|---|---:|---:|",
      ...rows.map(([op, ours, peer, theirs]) => `| ${op} | ${fmt(ours)} | ${peer} | ${fmt(theirs)} | ${fmt(ours / theirs, 2)} |`),
      "",
      "| request | median ms | p99 ms | peer | peer median ms | peer p99 ms | ratio (median) |",
      "|---|---:|---:|---|---:|---:|---:|",
      ...lat.map(([op, m, p, peer, pm, pp]) => `| ${op} | ${fmt(m, 2)} | ${fmt(p, 2)} | ${peer} | ${fmt(pm, 2)} | ${fmt(pp, 2)} | ${fmt(m / pm, 1)} |`),
    ].join("\n");
  } finally {
    for (const child of children) await stop(child);
    await rm(work, { recursive: true, force: true });
  }
}

async function nginxVersion(): Promise<string> {
  try {
    const { stderr } = await run$("/usr/sbin/nginx", ["-v"]);
    return stderr.trim().replace(/^nginx version: nginx\//, "");
  } catch {
    return "";
  }
}
