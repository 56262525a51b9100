/**
 * Depot bytes benchmark (issue 8 items 3 and 4): a 256 MiB file through the depot (fs
 * store with fsync and without, servePackageRouter in child processes) against nginx on
 * the same disk (WebDAV `PUT` for uploads, static `GET` for downloads), with curl as the
 * client of all: upload, commit (against one SHA-256 pass over the file, measured in the
 * same rounds), download and download with Range; then the bytes on disk for 3 versions
 * of 3 packages sharing the file, against the unique bytes. Contenders take turns round by
 * round (the machine is shared and its load changes), each upload on bytes new to its store.
 *
 * nginx comes from Debian (`/usr/sbin/nginx`); it is installed with apt-get only under
 * `npm run bench -- depot-bytes --install-peers`, otherwise its rows say what is missing.
 */
import { execFile, type ChildProcess } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { createReadStream } from "node:fs";
import { mkdir, mkdtemp, open, readdir, readFile, rm, stat } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { peerMissing, type SystemPeer } from "./peers.js";
import { startDepot, stop } from "./children.js";
import { freePort, startNginx } from "./nginx.js";

const run$ = promisify(execFile);
const MiB = 2 ** 20;
/** 256 MiB; BENCH_FILE_MIB overrides it for a quick trial (the report states the size used). */
const FILE_BYTES = (Number(process.env.BENCH_FILE_MIB) || 256) * MiB;
/** Rounds per measure: 7, so the median outlasts a few rounds hit by another process's burst (the machine is shared). */
const RUNS = 7;

const mbps = (bytes: number, ms: number) => bytes / 1e6 / (ms / 1000);
const fmt = (n: number, digits = 0) => n.toFixed(digits);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function timed(fn: () => Promise<unknown>): Promise<number> {
  const start = performance.now();
  await fn();
  return performance.now() - start;
}

let ticksPerSecond: number | undefined;

/**
 * CPU time (user + system) of a process and its descendants so far, ms, from /proc (Linux
 * only; NaN elsewhere). The server's CPU per transfer does not depend on what else the
 * machine runs, unlike its wall time, so it shows where a loaded run's ratio comes from.
 */
async function cpuMs(pid: number | undefined): Promise<number> {
  if (pid === undefined || process.platform !== "linux") return Number.NaN;
  ticksPerSecond ??= Number((await run$("getconf", ["CLK_TCK"])).stdout.trim()) || 100;
  let ticks = 0;
  const visit = async (id: number): Promise<void> => {
    const stat = await readFile(`/proc/${id}/stat`, "utf8").catch(() => "");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    ticks += Number(fields[11] ?? 0) + Number(fields[12] ?? 0); // utime, stime
    const children = await readFile(`/proc/${id}/task/${id}/children`, "utf8").catch(() => "");
    for (const child of children.split(" ").filter(Boolean)) await visit(Number(child));
  };
  await visit(pid);
  return (ticks / ticksPerSecond) * 1000;
}

/** Wall time and the server's CPU time of one operation, ms. */
interface Cost {
  ms: number;
  cpu: number;
}

async function costOf(serverPid: number | undefined, fn: () => Promise<unknown>): Promise<Cost> {
  const cpu0 = await cpuMs(serverPid);
  const ms = await timed(fn);
  return { ms, cpu: (await cpuMs(serverPid)) - cpu0 };
}

/** The median wall time and the median server CPU of some runs (each its own median). */
function medianCost(costs: Cost[]): Cost {
  return { ms: median(costs.map((c) => c.ms)), cpu: median(costs.map((c) => c.cpu)) };
}

/** The peer of the upload and download rows (a Debian package). */
const NGINX: SystemPeer = { name: "nginx", bin: "/usr/sbin/nginx", aptPackage: "nginx", module: "depot-bytes" };

/** nginx's binary, installed only under --install-peers (bench/peers.ts); the reason it is missing otherwise. */
async function findNginx(installPeers: boolean): Promise<{ bin: string } | { missing: string }> {
  const missing = await peerMissing(NGINX, installPeers);
  return missing ? { missing } : { bin: NGINX.bin };
}

/** One curl transfer; throws unless the status is `expect`. Same client for the depot and nginx. */
async function curl(args: string[], expect: number): Promise<string> {
  const { stdout } = await run$("curl", ["-sS", "-H", "Expect:", "-w", "\n%{http_code}", ...args], {
    maxBuffer: 16 * MiB,
  });
  const lines = stdout.trimEnd().split("\n");
  const status = Number(lines.at(-1));
  if (status !== expect)
    throw new Error(
      `curl ${args.join(" ")}: ${status}, expected ${expect}: ${lines.slice(0, -1).join("\n").slice(0, 300)}`,
    );
  return lines.slice(0, -1).join("\n");
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

async function sha256Pass(file: string): Promise<void> {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(file, { highWaterMark: MiB })) hash.update(chunk as Buffer);
  hash.digest();
}

async function openTransaction(url: string, spec: string): Promise<string> {
  const response = await fetch(`${url}/trans/${spec}`, { method: "POST" });
  if (response.status !== 201) throw new Error(`open ${spec}: ${response.status}`);
  return ((await response.json()) as { transaction: string }).transaction;
}

/** Bytes of the store's blobs: apparent (sum of sizes) and allocated (du). */
async function storeBytes(dir: string): Promise<{ apparent: number; allocated: number }> {
  let apparent = 0;
  let allocated = 0;
  const root = path.join(dir, "blobs", "sha256");
  for (const shard of await readdir(root)) {
    for (const name of await readdir(path.join(root, shard))) {
      const info = await stat(path.join(root, shard, name));
      apparent += info.size;
      allocated += info.blocks * 512;
    }
  }
  return { apparent, allocated };
}

/** A depot server under measurement, with its store's fsync setting. */
interface Depot {
  url: string;
  pid: number | undefined;
  label: string;
}

/** Rewrites the file's first 8 bytes, so the next run uploads bytes no store holds yet (no store skips a write). */
async function freshen(file: string): Promise<void> {
  const fh = await open(file, "r+");
  try {
    await fh.write(randomBytes(8), 0, 8, 0);
  } finally {
    await fh.close();
  }
}

/** `POST /add` of `file` into a fresh transaction of `spec`; the transaction id. */
async function addFile(depot: Depot, spec: string, file: string, cost?: Cost[]): Promise<string> {
  const id = await openTransaction(depot.url, spec);
  const upload = () =>
    curl(["-o", "/dev/null", "-X", "POST", "-T", file, "-H", "Pkg-Path: big.bin", `${depot.url}/add/${id}/file`], 201);
  if (cost) cost.push(await costOf(depot.pid, upload));
  else await upload();
  return id;
}

/**
 * Writes the page cache's dirty bytes to the disk (sync(1)), so a turn does not pay for
 * the write-back of the turns before it (an fsync queues behind it, the others do not).
 */
async function settle(): Promise<void> {
  await run$("sync");
}

/**
 * RUNS rounds in which every contender takes one turn, in an order rotating by round, so
 * a change in the machine's load falls alike on all of them (the machine is shared); the
 * disk is settled before each turn.
 */
async function rounds(
  turns: Array<(round: number) => Promise<void>>,
  before?: (round: number) => Promise<void>,
): Promise<void> {
  for (let round = 0; round < RUNS; round++) {
    await before?.(round);
    for (let k = 0; k < turns.length; k++) {
      await settle();
      await turns[(round + k) % turns.length]!(round);
    }
  }
}

/** The median over rounds of `peer[i] / ours[i]`: each ratio from turns taken back to back. */
function pairedRatio(peer: number[], ours: number[]): number {
  return median(ours.map((ms, i) => peer[i]! / ms));
}

/** Upload and commit of the file on each depot (fsync on and off), the SHA-256 pass and nginx's `PUT`, interleaved. */
async function measureWrites(
  depots: Depot[],
  nginx: { url: string; pid: number | undefined } | undefined,
  source: string,
) {
  const uploads = depots.map(() => [] as Cost[]);
  const puts: Cost[] = [];
  await rounds(
    [
      ...depots.map((depot, d) => async (round: number) => {
        const id = await addFile(depot, `rawup@1.0.${round}`, source, uploads[d]);
        await fetch(`${depot.url}/trans/${id}`, { method: "DELETE" });
      }),
      ...(nginx
        ? [
            async (round: number) => {
              // Kept, like the depot's blobs: both leave their bytes to the kernel's writeback alike.
              puts.push(
                await costOf(nginx.pid, () =>
                  curl(["-o", "/dev/null", "-T", source, `${nginx.url}/dav/big-${round}.bin`], 201),
                ),
              );
            },
          ]
        : []),
    ],
    () => freshen(source),
  );
  // Commit: the archive's digest from one pass over the assembled stream, against one
  // SHA-256 pass over the file in this process, in the same rounds.
  const commits = depots.map(() => [] as Cost[]);
  const shas: number[] = [];
  await rounds(
    [
      ...depots.map((depot, d) => async (round: number) => {
        const id = await addFile(depot, `big@1.0.${round}`, source);
        await settle();
        commits[d]!.push(
          await costOf(depot.pid, () => curl(["-o", "/dev/null", "-X", "POST", `${depot.url}/commit/${id}`], 201)),
        );
      }),
      async () => void shas.push(await timed(() => sha256Pass(source))),
    ],
    () => freshen(source),
  );
  return { uploads, puts, commits, shas };
}

/** The commit's fixed cost (records, fsyncs, HTTP) apart from hashing: a 6-byte package. */
async function tinyCommit(depot: Depot): Promise<Cost> {
  const costs: Cost[] = [];
  for (let i = 0; i < RUNS; i++) {
    const id = await openTransaction(depot.url, `tiny@1.0.${i}`);
    await curl(
      [
        "-o",
        "/dev/null",
        "-X",
        "POST",
        "--data-binary",
        "hello\n",
        "-H",
        "Pkg-Path: hello.txt",
        `${depot.url}/add/${id}/file`,
      ],
      201,
    );
    costs.push(
      await costOf(depot.pid, () => curl(["-o", "/dev/null", "-X", "POST", `${depot.url}/commit/${id}`], 201)),
    );
  }
  return medianCost(costs);
}

/** `GET /data` whole and with `Range` against nginx's static `GET` of the same archive bytes, interleaved. */
async function measureReads(depot: Depot, nginx: { url: string; pid: number | undefined } | undefined, range: string) {
  const gets: Cost[] = [];
  const ranges: Cost[] = [];
  const peerGets: Cost[] = [];
  const peerRanges: Cost[] = [];
  const get = (url: string, costs: Cost[], pid: number | undefined, rangeArgs: string[], status: number) => async () =>
    void costs.push(await costOf(pid, () => curl(["-o", "/dev/null", ...rangeArgs, url], status)));
  const data = `${depot.url}/data/big@1.0.0`;
  await rounds([
    get(data, gets, depot.pid, [], 200),
    ...(nginx ? [get(`${nginx.url}/big.tar`, peerGets, nginx.pid, [], 200)] : []),
  ]);
  await rounds([
    get(data, ranges, depot.pid, ["-r", range], 206),
    ...(nginx ? [get(`${nginx.url}/big.tar`, peerRanges, nginx.pid, ["-r", range], 206)] : []),
  ]);
  return { gets, ranges, peerGets, peerRanges };
}

/** Bytes on disk: 3 versions of 3 packages sharing the file (plus a small file each), against the unique bytes. */
async function measureSharing(work: string, source: string, children: ChildProcess[]) {
  const shareDir = path.join(work, "share-store");
  const share = await startDepot(shareDir);
  children.push(share.child);
  let unique = FILE_BYTES;
  for (const name of ["alpha", "beta", "gamma"]) {
    for (const version of ["1.0.0", "1.1.0", "2.0.0"]) {
      const id = await openTransaction(share.url, `${name}@${version}`);
      await curl(
        ["-o", "/dev/null", "-X", "POST", "-T", source, "-H", "Pkg-Path: data/big.bin", `${share.url}/add/${id}/file`],
        201,
      );
      const own = `${name}@${version}\n`;
      unique += Buffer.byteLength(own);
      await curl(
        [
          "-o",
          "/dev/null",
          "-X",
          "POST",
          "--data-binary",
          own,
          "-H",
          "Pkg-Path: VERSION",
          `${share.url}/add/${id}/file`,
        ],
        201,
      );
      await curl(["-o", "/dev/null", "-X", "POST", `${share.url}/commit/${id}`], 201);
    }
  }
  await stop(share.child);
  return { ...(await storeBytes(shareDir)), unique };
}

/** Runs the benchmark and returns its Markdown section. */
export async function run(options: { installPeers?: boolean } = {}): Promise<string> {
  const loadBefore = os.loadavg()[0]!;
  const work = await mkdtemp(path.join(os.tmpdir(), "bench-depot-bytes-"));
  const children: ChildProcess[] = [];
  try {
    const source = path.join(work, "source.bin");
    const www = path.join(work, "www");
    await mkdir(www);
    await makeFile(source, FILE_BYTES);
    await sha256Pass(source); // warm the page cache for every reader alike

    const depots: Depot[] = [];
    for (const [label, noSync] of [
      ["fsync on", false],
      ["fsync off", true],
    ] as const) {
      const started = await startDepot(path.join(work, noSync ? "store-nosync" : "store"), { noSync });
      children.push(started.child);
      depots.push({ url: started.url, pid: started.child.pid, label });
    }
    // nginx on the same disk, the same curl.
    const found = await findNginx(options.installPeers === true);
    let nginx: { url: string; pid: number | undefined; version: string } | undefined;
    if ("bin" in found) {
      const started = await startNginx(found.bin, work, www, { dav: true });
      children.push(started.child);
      nginx = { url: started.url, pid: started.child.pid, version: started.version };
    }

    const writes = await measureWrites(depots, nginx, source);
    const tiny = await tinyCommit(depots[0]!);
    const synced = depots[0]!;
    const archiveSize = Number(
      (await fetch(`${synced.url}/data/big@1.0.0`, { method: "HEAD" })).headers.get("content-length"),
    );
    const rangeStart = 1000;
    const rangeBytes = Math.min(200_000_000, archiveSize - rangeStart - 1);
    const range = `${rangeStart}-${rangeStart + rangeBytes - 1}`;
    await curl(["-o", path.join(www, "big.tar"), `${synced.url}/data/big@1.0.0`], 200);
    const reads = await measureReads(synced, nginx, range);
    for (const depot of depots) await stop(children.find((c) => c.pid === depot.pid));
    const disk = await measureSharing(work, source, children);

    const skipped = nginx ? "" : `: skipped — ${"missing" in found ? found.missing : ""}`;
    /** A row of the first table: medians of MB/s and CPU, the ratio paired by round. */
    const row = (operation: string, bytes: number, ours: Cost[], peerName: string, peer: Cost[], aim: string) => {
      const mine = medianCost(ours);
      const theirs = peer.length > 0 ? medianCost(peer) : undefined;
      const ratio = theirs
        ? fmt(
            pairedRatio(
              peer.map((c) => c.ms),
              ours.map((c) => c.ms),
            ),
            2,
          )
        : "";
      return `| ${operation} | ${fmt(mbps(bytes, mine.ms))} | ${peerName}${skipped} | ${theirs ? fmt(mbps(bytes, theirs.ms)) : ""} | ${ratio} | ${aim} | ${fmt(mine.cpu)} / ${theirs ? fmt(theirs.cpu) : "–"} |`;
    };
    const rows = [
      ...depots.map((depot, d) =>
        row(
          `upload: \`POST /add\` (curl -T), store ${depot.label}`,
          FILE_BYTES,
          writes.uploads[d]!,
          "nginx WebDAV `PUT` (curl -T; never syncs)",
          writes.puts,
          "≥ 0.8",
        ),
      ),
      row(
        "download: `GET /data` (curl)",
        archiveSize,
        reads.gets,
        "nginx static `GET` of the same archive",
        reads.peerGets,
        "≥ 0.9",
      ),
      row(
        `download with \`Range\` (${rangeBytes / 1e6} MB from byte ${rangeStart})`,
        rangeBytes,
        reads.ranges,
        "nginx static `GET` with the same `Range`",
        reads.peerRanges,
        "≥ 0.9",
      ),
    ];
    const shaMs = median(writes.shas);
    const commitRows = depots.map((depot, d) => {
      const commit = medianCost(writes.commits[d]!);
      const ratio = pairedRatio(
        writes.commits[d]!.map((c) => c.ms),
        writes.shas,
      );
      return `| commit of the ${FILE_BYTES / MiB} MiB version (\`POST /commit\`), store ${depot.label} | ${fmt(commit.ms)} ms | one SHA-256 pass over the file | ${fmt(shaMs)} ms | ${fmt(ratio, 2)}× | ≤ 2× | ${fmt(commit.cpu)} |`;
    });
    const nginxNote = nginx
      ? `nginx ${nginx.version} (one worker, sendfile, WebDAV \`dav_methods PUT\` with its body temp files on the same disk) is the peer. nginx never fsyncs an upload: its \`PUT\` ends with the bytes in the page cache, while the depot's default store syncs the blob before renaming it in (flushing in the background every 32 MiB as it arrives), so its "fsync on" upload includes writing the file to the disk and depends on the disk's speed; the "fsync off" row (\`createFsStore(dir, { unsafeNoSync: true })\`, the same server otherwise) is the like-for-like comparison`
      : `nginx rows skipped: ${"missing" in found ? found.missing : ""}`;
    const load = `${fmt(loadBefore, 1)} before, ${fmt(os.loadavg()[0]!, 1)} after`;
    return [
      "## Depot bytes",
      "",
      `Method: a ${FILE_BYTES / MiB} MiB file of random bytes on ${os.tmpdir()}; the depot is \`servePackageRouter\` (native Node handler) over \`createFsStore\` in a child process, one server with fsync (the store's default) and one without; ${nginxNote}. curl ${(await run$("curl", ["--version"])).stdout.split(" ")[1]} is the client of all (\`-o /dev/null\`, no \`Expect: 100-continue\`). The contenders of a row take turns within each of ${RUNS} rounds, in an order rotating by round, so the shared machine's changing load falls alike on each; before each upload or commit round the file's first 8 bytes change, so every upload writes bytes new to its store. The disk is settled (sync(1)) before every turn, so no turn pays for the write-back of another's bytes. Each figure is the median of the ${RUNS} runs, MB = 10⁶ bytes; ratio = depot ÷ nginx as throughput, the median over rounds of nginx time ÷ depot time in the same round (for a commit: its time ÷ the SHA-256 pass's in the same round). Server CPU is the user + system time of the server process (and its children) during the operation, from /proc. The SHA-256 pass is Node's \`createHash\` over the file from the page cache, in this process. ${os.cpus().length} cores; 1-minute load average ${load}${loadBefore > os.cpus().length ? " (a loaded machine: the wall times are noisy)" : ""}.`,
      "",
      "| operation | depot MB/s | peer | peer MB/s | ratio | aim | server CPU ms, depot / peer |",
      "|---|---:|---|---:|---:|---|---:|",
      ...rows,
      "",
      "| measure | depot | peer | peer | ratio | aim | depot server CPU ms |",
      "|---|---:|---|---:|---:|---|---:|",
      ...commitRows,
      `| commit of a 6-byte one-file version, fsync on (the fixed cost: records, fsyncs, HTTP) | ${fmt(tiny.ms)} ms | | | | | ${fmt(tiny.cpu)} |`,
      `| bytes on disk, 3 versions × 3 packages sharing the file (blobs, apparent) | ${fmt(disk.apparent / MiB, 1)} MiB | unique bytes | ${fmt(disk.unique / MiB, 1)} MiB | ${fmt(disk.apparent / disk.unique, 3)}× | ≤ 1.05× | |`,
      `| the same, allocated (\`du\`) | ${fmt(disk.allocated / MiB, 1)} MiB | unique bytes | ${fmt(disk.unique / MiB, 1)} MiB | ${fmt(disk.allocated / disk.unique, 3)}× | ≤ 1.05× | |`,
    ].join("\n");
  } finally {
    for (const child of children) await stop(child);
    await rm(work, { recursive: true, force: true });
  }
}
