/**
 * Depot bytes benchmark (issue 8 items 3 and 4): a 256 MiB file through the depot (fs
 * store with fsync, servePackageRouter in a child process) against nginx on the same disk
 * (WebDAV `PUT` for uploads, static `GET` for downloads), with curl as the client of both:
 * upload, commit (against one SHA-256 pass over the file, measured in the same run),
 * download and download with Range; then the bytes on disk for 3 versions of 3 packages
 * sharing the file, against the unique bytes.
 *
 * nginx comes from Debian (`/usr/sbin/nginx`); it is installed with apt-get only under
 * `npm run bench -- depot-bytes --install-peers`, otherwise its rows say what is missing.
 */
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { createReadStream } from "node:fs";
import { mkdir, mkdtemp, open, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { peerMissing, type SystemPeer } from "./peers.js";
import { startDepot, waitForPort, stop } from "./children.js";

const run$ = promisify(execFile);
const MiB = 2 ** 20;
/** 256 MiB; BENCH_FILE_MIB overrides it for a quick trial (the report states the size used). */
const FILE_BYTES = (Number(process.env.BENCH_FILE_MIB) || 256) * MiB;
const RUNS = 3;

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

/** The peer of the upload and download rows (a Debian package). */
const NGINX: SystemPeer = { name: "nginx", bin: "/usr/sbin/nginx", aptPackage: "nginx", module: "depot-bytes" };

/** nginx's binary, installed only under --install-peers (bench/peers.ts); the reason it is missing otherwise. */
async function findNginx(installPeers: boolean): Promise<{ bin: string } | { missing: string }> {
  const missing = await peerMissing(NGINX, installPeers);
  return missing ? { missing } : { bin: NGINX.bin };
}

/** nginx on 127.0.0.1 (temp config and prefix): static files from `root`, WebDAV PUT under /dav/. */
async function startNginx(bin: string, work: string, root: string): Promise<{ url: string; child: ChildProcess; version: string }> {
  const port = await freePort();
  const prefix = path.join(work, "nginx");
  await mkdir(path.join(prefix, "logs"), { recursive: true });
  await mkdir(path.join(root, "dav"), { recursive: true });
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
  default_type application/octet-stream;
  client_body_temp_path ${root}/dav-tmp;
  proxy_temp_path ${prefix}/proxy;
  fastcgi_temp_path ${prefix}/fastcgi;
  uwsgi_temp_path ${prefix}/uwsgi;
  scgi_temp_path ${prefix}/scgi;
  server {
    listen 127.0.0.1:${port};
    root ${root};
    location /dav/ {
      dav_methods PUT;
      create_full_put_path on;
      client_max_body_size 0;
    }
  }
}
`,
  );
  const child = spawn(bin, ["-p", prefix, "-c", conf], { stdio: ["ignore", "inherit", "inherit"] });
  await waitForPort(port, child);
  const { stderr } = await run$(bin, ["-v"]);
  return { url: `http://127.0.0.1:${port}`, child, version: stderr.trim().replace(/^nginx version: nginx\//, "") };
}

/** One curl transfer; throws unless the status is `expect`. Same client for the depot and nginx. */
async function curl(args: string[], expect: number): Promise<string> {
  const { stdout } = await run$("curl", ["-sS", "-H", "Expect:", "-w", "\n%{http_code}", ...args], { maxBuffer: 16 * MiB });
  const lines = stdout.trimEnd().split("\n");
  const status = Number(lines.at(-1));
  if (status !== expect) throw new Error(`curl ${args.join(" ")}: ${status}, expected ${expect}: ${lines.slice(0, -1).join("\n").slice(0, 300)}`);
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
    const shaMs = median(await sequential(RUNS, () => timed(() => sha256Pass(source))));

    const storeDir = path.join(work, "store");
    const depot = await startDepot(storeDir);
    children.push(depot.child);
    const depotPid = depot.child.pid;

    // Upload: the bare POST /add of the file with curl (transactions abandoned afterwards).
    const uploads: Cost[] = [];
    for (let i = 0; i < RUNS; i++) {
      const id = await openTransaction(depot.url, `rawup@1.0.${i}`);
      uploads.push(await costOf(depotPid, () => curl(["-o", "/dev/null", "-X", "POST", "-T", source, "-H", "Pkg-Path: big.bin", `${depot.url}/add/${id}/file`], 201)));
      await fetch(`${depot.url}/trans/${id}`, { method: "DELETE" });
    }
    // Commit: the archive's digest from one pass over the assembled stream.
    const commits: Cost[] = [];
    for (let i = 0; i < RUNS; i++) {
      const id = await openTransaction(depot.url, `big@1.0.${i}`);
      await curl(["-o", "/dev/null", "-X", "POST", "-T", source, "-H", "Pkg-Path: big.bin", `${depot.url}/add/${id}/file`], 201);
      commits.push(await costOf(depotPid, () => curl(["-o", "/dev/null", "-X", "POST", `${depot.url}/commit/${id}`], 201)));
    }
    // The commit's fixed cost (records, fsyncs, HTTP) apart from hashing: a 6-byte package.
    const tinyCommits: Cost[] = [];
    for (let i = 0; i < RUNS; i++) {
      const id = await openTransaction(depot.url, `tiny@1.0.${i}`);
      await curl(["-o", "/dev/null", "-X", "POST", "--data-binary", "hello\n", "-H", "Pkg-Path: hello.txt", `${depot.url}/add/${id}/file`], 201);
      tinyCommits.push(await costOf(depotPid, () => curl(["-o", "/dev/null", "-X", "POST", `${depot.url}/commit/${id}`], 201)));
    }
    const archiveSize = Number((await fetch(`${depot.url}/data/big@1.0.0`, { method: "HEAD" })).headers.get("content-length"));
    const rangeStart = 1000;
    const rangeBytes = Math.min(200_000_000, archiveSize - rangeStart - 1);
    const range = `${rangeStart}-${rangeStart + rangeBytes - 1}`;
    const depotGet = medianCost(await sequential(RUNS, () => costOf(depotPid, () => curl(["-o", "/dev/null", `${depot.url}/data/big@1.0.0`], 200))));
    const depotRange = medianCost(await sequential(RUNS, () => costOf(depotPid, () => curl(["-o", "/dev/null", "-r", range, `${depot.url}/data/big@1.0.0`], 206))));
    await curl(["-o", path.join(www, "big.tar"), `${depot.url}/data/big@1.0.0`], 200);

    // nginx on the same disk, the same curl.
    const found = await findNginx(options.installPeers === true);
    let nginxRows: string[];
    let nginxNote: string;
    const upload = medianCost(uploads);
    const cpuCell = (ours: Cost, peer?: Cost) => `${fmt(ours.cpu)} / ${peer ? fmt(peer.cpu) : "–"}`;
    if ("bin" in found) {
      const nginx = await startNginx(found.bin, work, www);
      children.push(nginx.child);
      const nginxPid = nginx.child.pid;
      const put = medianCost(await sequential(RUNS, (i) => costOf(nginxPid, () => curl(["-o", "/dev/null", "-T", source, `${nginx.url}/dav/big-${i}.bin`], 201))));
      const get = medianCost(await sequential(RUNS, () => costOf(nginxPid, () => curl(["-o", "/dev/null", `${nginx.url}/big.tar`], 200))));
      const rng = medianCost(await sequential(RUNS, () => costOf(nginxPid, () => curl(["-o", "/dev/null", "-r", range, `${nginx.url}/big.tar`], 206))));
      nginxRows = [
        `| upload: \`POST /add\` (curl -T) | ${fmt(mbps(FILE_BYTES, upload.ms))} | nginx WebDAV \`PUT\` (curl -T) | ${fmt(mbps(FILE_BYTES, put.ms))} | ${fmt(put.ms / upload.ms, 2)} | ≥ 0.8 | ${cpuCell(upload, put)} |`,
        `| download: \`GET /data\` (curl) | ${fmt(mbps(archiveSize, depotGet.ms))} | nginx static \`GET\` of the same archive | ${fmt(mbps(archiveSize, get.ms))} | ${fmt(get.ms / depotGet.ms, 2)} | ≥ 0.9 | ${cpuCell(depotGet, get)} |`,
        `| download with \`Range\` (${rangeBytes / 1e6} MB from byte ${rangeStart}) | ${fmt(mbps(rangeBytes, depotRange.ms))} | nginx static \`GET\` with the same \`Range\` | ${fmt(mbps(rangeBytes, rng.ms))} | ${fmt(rng.ms / depotRange.ms, 2)} | ≥ 0.9 | ${cpuCell(depotRange, rng)} |`,
      ];
      nginxNote = `nginx ${nginx.version} (one worker, sendfile, WebDAV \`dav_methods PUT\` with its body temp files on the same disk; it does not fsync)`;
    } else {
      nginxRows = [
        `| upload: \`POST /add\` (curl -T) | ${fmt(mbps(FILE_BYTES, upload.ms))} | nginx WebDAV \`PUT\`: skipped — ${found.missing} | | | ≥ 0.8 | ${cpuCell(upload)} |`,
        `| download: \`GET /data\` (curl) | ${fmt(mbps(archiveSize, depotGet.ms))} | nginx static \`GET\`: skipped | | | ≥ 0.9 | ${cpuCell(depotGet)} |`,
        `| download with \`Range\` (${rangeBytes / 1e6} MB) | ${fmt(mbps(rangeBytes, depotRange.ms))} | nginx static \`GET\` with \`Range\`: skipped | | | ≥ 0.9 | ${cpuCell(depotRange)} |`,
      ];
      nginxNote = `nginx rows skipped: ${found.missing}`;
    }
    await stop(depot.child);

    // Bytes on disk: 3 versions of 3 packages sharing the file (plus a small file each).
    const shareDir = path.join(work, "share-store");
    const share = await startDepot(shareDir);
    children.push(share.child);
    let unique = FILE_BYTES;
    for (const name of ["alpha", "beta", "gamma"]) {
      for (const version of ["1.0.0", "1.1.0", "2.0.0"]) {
        const id = await openTransaction(share.url, `${name}@${version}`);
        await curl(["-o", "/dev/null", "-X", "POST", "-T", source, "-H", "Pkg-Path: data/big.bin", `${share.url}/add/${id}/file`], 201);
        const own = `${name}@${version}\n`;
        unique += Buffer.byteLength(own);
        await curl(["-o", "/dev/null", "-X", "POST", "--data-binary", own, "-H", "Pkg-Path: VERSION", `${share.url}/add/${id}/file`], 201);
        await curl(["-o", "/dev/null", "-X", "POST", `${share.url}/commit/${id}`], 201);
      }
    }
    await stop(share.child);
    const disk = await storeBytes(shareDir);

    const commit = medianCost(commits);
    const tiny = medianCost(tinyCommits);
    const load = `${fmt(loadBefore, 1)} before, ${fmt(os.loadavg()[0]!, 1)} after`;
    return [
      "## Depot bytes",
      "",
      `Method: a ${FILE_BYTES / MiB} MiB file of random bytes on ${os.tmpdir()}; the depot is \`servePackageRouter\` (native Node handler) over \`createFsStore\` with fsync (its default) in a child process; ${nginxNote}; curl ${(await run$("curl", ["--version"])).stdout.split(" ")[1]} is the client of both (\`-o /dev/null\`, no \`Expect: 100-continue\`). Each figure is the median of ${RUNS} runs, MB = 10⁶ bytes; ratio = depot ÷ nginx as throughput (nginx time ÷ depot time). Server CPU is the user + system time of the server process (and its children) during the operation, from /proc: unlike wall time it does not grow with the machine's load. The SHA-256 pass is Node's \`createHash\` over the file from the page cache, in this process. ${os.cpus().length} cores; 1-minute load average ${load}.`,
      "",
      "| operation | depot MB/s | peer | peer MB/s | ratio | aim | server CPU ms, depot / peer |",
      "|---|---:|---|---:|---:|---|---:|",
      ...nginxRows,
      "",
      "| measure | depot | peer | peer | ratio | aim | depot server CPU ms |",
      "|---|---:|---|---:|---:|---|---:|",
      `| commit of the ${FILE_BYTES / MiB} MiB version (\`POST /commit\`) | ${fmt(commit.ms)} ms | one SHA-256 pass over the file | ${fmt(shaMs)} ms | ${fmt(commit.ms / shaMs, 2)}× | ≤ 2× | ${fmt(commit.cpu)} |`,
      `| commit of a 6-byte one-file version (the fixed cost: records, fsyncs, HTTP) | ${fmt(tiny.ms)} ms | | | | | ${fmt(tiny.cpu)} |`,
      `| bytes on disk, 3 versions × 3 packages sharing the file (blobs, apparent) | ${fmt(disk.apparent / MiB, 1)} MiB | unique bytes | ${fmt(unique / MiB, 1)} MiB | ${fmt(disk.apparent / unique, 3)}× | ≤ 1.05× | |`,
      `| the same, allocated (\`du\`) | ${fmt(disk.allocated / MiB, 1)} MiB | unique bytes | ${fmt(unique / MiB, 1)} MiB | ${fmt(disk.allocated / unique, 3)}× | ≤ 1.05× | |`,
    ].join("\n");
  } finally {
    for (const child of children) await stop(child);
    await rm(work, { recursive: true, force: true });
  }
}

async function sequential<T>(n: number, fn: (i: number) => Promise<T>): Promise<T[]> {
  const out: T[] = [];
  for (let i = 0; i < n; i++) out.push(await fn(i));
  return out;
}
