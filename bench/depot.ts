/**
 * Depot benchmark: a 256 MiB file through the depot (fs store, servePackageRouter in a
 * child process, real fetch from this process) against `cp` of the same file on the same
 * disk and nginx serving it, all in one run. Catalog and per-package latencies at scale are
 * bench/depot-scale.ts.
 */
import { execFile, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { createReadStream, createWriteStream } from "node:fs";
import { mkdir, mkdtemp, open, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { promisify } from "node:util";
import { createFsStore } from "../src/adapters/fs/store.js";
import { createDepotClient } from "../src/depot/client/depot-client.js";
import { peerMissing, type SystemPeer } from "./peers.js";
import { startDepot, stop } from "./children.js";
import { freePort, startNginx } from "./nginx.js";

const run$ = promisify(execFile);
const MiB = 2 ** 20;
const FILE_BYTES = 256 * MiB;

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

/** The peer of the download and catalog rows. */
const NGINX: SystemPeer = { name: "nginx", bin: "/usr/sbin/nginx", aptPackage: "nginx", module: "depot" };

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
async function latencies(
  url: string,
  n: number,
  warm: number,
  headers: Record<string, string>,
  expect: number,
): Promise<number[]> {
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

/**
 * Runs the depot benchmark and returns its Markdown section. Without nginx (and without
 * `installPeers`) the rows measured against it are left out and the section says why.
 */
export async function run(options: { installPeers?: boolean } = {}): Promise<string> {
  const missing = await peerMissing(NGINX, options.installPeers === true);
  if (missing) console.error(`bench depot: skipping the rows against nginx: ${missing}`);
  const work = await mkdtemp(path.join(os.tmpdir(), "bench-depot-"));
  const children: ChildProcess[] = [];
  try {
    const source = path.join(work, "source.bin");
    const www = path.join(work, "www");
    await mkdir(www);
    await makeFile(source, FILE_BYTES);

    // cp of the same file on the same disk.
    const copy = path.join(work, "copy.bin");
    const cpMs = await medianOf(
      3,
      () => run$("cp", [source, copy]),
      () => rm(copy, { force: true }),
    );

    // The depot: fs store (with fsync, its default), server in a child process.
    const depot = await startDepot(path.join(work, "store"));
    children.push(depot.child);
    const client = createDepotClient({ baseUrl: depot.url });

    // Upload: the bare POST /add of the file (one transaction, abandoned afterwards).
    const uploads: number[] = [];
    for (let i = 0; i < 3; i++) {
      await restamp(source, i);
      const opened = (await (await fetch(`${depot.url}/trans/rawup@1.0.${i}`, { method: "POST" })).json()) as {
        transaction: string;
      };
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
    const publishMs = await timed(() =>
      client.publish({ name: "big", version: "1.0.0", items: [{ type: "file", path: "big.bin", file: source }] }),
    );
    const info = (await client.versions("big")).versions[0]!;

    // Downloads: the depot's archive (256 MiB + 1.5 KiB of tar) and nginx serving the same archive bytes.
    const archive = path.join(www, "big.tar");
    await client.download("big@1.0.0", { to: archive });
    const out = path.join(work, "out.bin");
    const dropOut = () => rm(out, { force: true });
    const depotGetMs = await medianOf(3, () => fetchToFile(`${depot.url}/data/big@1.0.0`, out), dropOut);
    const clientGetMs = await medianOf(3, () => client.download("big@1.0.0", { to: out }), dropOut);
    const nginx = missing ? null : await startNginx(NGINX.bin, work, www);
    if (nginx) children.push(nginx.child);
    const nginxGetMs = nginx ? await medianOf(3, () => fetchToFile(`${nginx.url}/big.tar`, out), dropOut) : null;
    const cpArchiveMs = await medianOf(3, () => run$("cp", [archive, out]), dropOut);
    await stop(depot.child);

    const bytes = FILE_BYTES;
    // Rows whose peer is nginx exist only when nginx ran.
    const nginxRows = (
      nginxGetMs === null
        ? []
        : [
            [
              "download: `GET /data` to a file",
              mbps(info.size, depotGetMs),
              "nginx `GET` to a file (same loop)",
              mbps(info.size, nginxGetMs),
            ],
            [
              "download: `client.download` (SHA-256 verified)",
              mbps(info.size, clientGetMs),
              "nginx `GET` to a file (same loop)",
              mbps(info.size, nginxGetMs),
            ],
          ]
    ) as Array<readonly [string, number, string, number]>;
    const rows = [
      ["upload: `POST /add` streamed (256 MiB)", mbps(bytes, uploadMs), "`cp` of the file", mbps(bytes, cpMs)],
      [
        "publish: `client.publish` (hash + probe + upload + commit)",
        mbps(bytes, publishMs),
        "`cp` of the file",
        mbps(bytes, cpMs),
      ],
      ...nginxRows,
      [
        "download: `GET /data` to a file",
        mbps(info.size, depotGetMs),
        "`cp` of the archive",
        mbps(info.size, cpArchiveMs),
      ],
    ] as const;
    return [
      "## Depot",
      "",
      ...(missing ? [`Skipped: the rows against nginx (downloads): ${missing}.`, ""] : []),
      `Method: a ${FILE_BYTES / MiB} MiB file of random bytes on ${os.tmpdir()}; the depot is \`servePackageRouter\` over \`createFsStore\` (fsync on, its default) in a child process, driven by real \`fetch\` from the bench process; nginx ${await nginxVersion()} (one worker, sendfile, temp config on 127.0.0.1) serves the same archive bytes; \`cp\` copies on the same disk. Throughputs are the median of 3 runs (publish: 1 run), MB = 10⁶ bytes; ratio = depot ÷ peer. Catalog and per-package latencies at scale: the depot-scale section.`,
      "",
      "| operation | depot MB/s | peer | peer MB/s | ratio |",
      "|---|---:|---|---:|---:|",
      ...rows.map(
        ([op, ours, peer, theirs]) => `| ${op} | ${fmt(ours)} | ${peer} | ${fmt(theirs)} | ${fmt(ours / theirs, 2)} |`,
      ),
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
