/**
 * Blob uploads benchmark (issue 28 items 3 and 4), a 256 MiB file each time:
 * - on S3 (the server RUNNER_DEPOT_BENCH_S3 names, else RUNNER_DEPOT_TEST_S3, else s3rver in
 *   its own process): the depot's `POST /add` with the digest declared (`Content-Digest`) and
 *   without, against a plain `@aws-sdk/lib-storage` `Upload` of the same file to the same
 *   server; then the commit of the version against one SHA-256 pass over the file, and the
 *   time until its archive is stored (the copy made after the commit, archive-keeper.ts), and
 *   the same commit on a store without its local copies of uploads (items read back from S3);
 * - on the fs store (fsync on, in a child process; hashing on its worker thread, and on its
 *   main thread): `POST /add` against nginx's WebDAV `PUT` followed by `sync FILE DIR`, the
 *   disk settled (sync, and the page cache dropped when allowed) before each turn; with
 *   each server's CPU time per upload.
 * curl is the client of the depot and of nginx. The depot on S3 runs in this process over
 * PostgreSQL records (the test setup's); the S3 server never does.
 *
 * RUNNER_DEPOT_BENCH_S3=http://ACCESS_KEY:SECRET_KEY@host:port (path-style; the keys may
 * instead come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY); the bench makes a bucket of
 * its own there and removes it after. RUNNER_DEPOT_BENCH_S3_VERIFIES=0 says the server does
 * not check the signed payload hash (the store's `serverVerifiesPayload: false`; s3rver is
 * known not to); RUNNER_DEPOT_BENCH_S3_NAME names the server in the report. Space: each
 * round stores about 1.5 GB (uploads, the peer's object, the committed item and archive);
 * the bench deletes its bucket at the end, but radosgw frees deleted objects only at its
 * garbage collection (hours later by default), so on the 16 GiB OSD of ceph-rgw.sh a few
 * runs in a row fill it (`radosgw-admin gc process --include-all` frees the space).
 */
import { execFile, type ChildProcess } from "node:child_process";
import { createHash, randomBytes, randomUUID } from "node:crypto";
import { createReadStream } from "node:fs";
import { mkdir, mkdtemp, open, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import {
  CreateBucketCommand,
  DeleteBucketCommand,
  DeleteObjectCommand,
  ListObjectsV2Command,
  S3Client,
  type S3ClientConfig,
} from "@aws-sdk/client-s3";
import { Upload } from "@aws-sdk/lib-storage";
import { createPostgresRecords } from "../src/adapters/postgres/index.js";
import { createS3BlobStore } from "../src/adapters/s3/index.js";
import { composeStore } from "../src/depot/store/compose.js";
import { createTestSchema, startS3 } from "../test/fixtures/backends.js";
import { startDepot as startDepotHere } from "../test/fixtures/depot.js";
import { startDepot, stop } from "./children.js";
import { startNginx } from "./nginx.js";
import { peerMissing } from "./peers.js";

const run$ = promisify(execFile);
const MiB = 2 ** 20;
/** 256 MiB; BENCH_FILE_MIB overrides it for a quick trial (the report states the size used). */
const FILE_BYTES = (Number(process.env.BENCH_FILE_MIB) || 256) * MiB;
/** Rounds per measure (each contender one turn a round, in an order rotating by round). */
const RUNS = Number(process.env.BENCH_ROUNDS) || 5;
/**
 * BENCH_FS_ONLY=1 measures the fs rows alone (a quick loop while working on the fs store);
 * the section of record comes from a full run.
 */
const FS_ONLY = process.env.BENCH_FS_ONLY === "1";

const mbps = (bytes: number, ms: number) => bytes / 1e6 / (ms / 1000);
const fmt = (n: number, digits = 0) => n.toFixed(digits);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function timed(fn: () => Promise<unknown>): Promise<number> {
  const start = performance.now();
  await fn();
  return performance.now() - start;
}

/** One curl transfer; throws unless the status is `expect`. */
async function curl(args: string[], expect: number): Promise<void> {
  const { stdout } = await run$("curl", ["-sS", "-H", "Expect:", "-o", "/dev/null", "-w", "%{http_code}", ...args]);
  if (Number(stdout.trim()) !== expect) throw new Error(`curl ${args.join(" ")}: ${stdout.trim()}, expected ${expect}`);
}

async function makeFile(file: string): Promise<void> {
  const fh = await open(file, "w");
  for (let i = 0; i < FILE_BYTES / MiB; i++) await fh.write(randomBytes(MiB));
  await fh.close();
}

async function sha256Hex(file: string): Promise<string> {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(file, { highWaterMark: MiB })) hash.update(chunk as Buffer);
  return hash.digest("hex");
}

/** New bytes at the file's start, so no store holds its content yet; its hex SHA-256. */
async function freshen(file: string): Promise<string> {
  const fh = await open(file, "r+");
  await fh.write(randomBytes(8), 0, 8, 0);
  await fh.close();
  return sha256Hex(file);
}

let dropAllowed: boolean | undefined;
/**
 * The disk settled before a turn: dirty pages written (sync(1)) and, when this process may,
 * the page cache dropped; then the source file read back in, so every contender reads it
 * from memory alike.
 */
async function settle(source: string, options: { keepCache?: boolean } = {}): Promise<void> {
  await run$("sync");
  if (!options.keepCache && dropAllowed !== false) {
    dropAllowed = await writeFile("/proc/sys/vm/drop_caches", "3").then(
      () => true,
      () => false,
    );
  }
  for await (const _ of createReadStream(source, { highWaterMark: MiB })) void _;
}

/** The S3 server to measure on: its client config, label, and a bucket of its own. */
interface S3Target {
  label: string;
  config: S3ClientConfig;
  bucket: string;
  verifies: boolean;
  close(): Promise<void>;
}

async function s3Target(): Promise<S3Target> {
  const named = process.env.RUNNER_DEPOT_BENCH_S3 ?? process.env.RUNNER_DEPOT_TEST_S3;
  const verifiesEnv = process.env.RUNNER_DEPOT_BENCH_S3_VERIFIES;
  if (!named) {
    const s3 = await startS3();
    return {
      label: "s3rver 3.7 (its own process)",
      config: s3.clientConfig!,
      bucket: s3.bucket,
      verifies: verifiesEnv === "1",
      close: () => s3.close(),
    };
  }
  const url = new URL(named);
  const config: S3ClientConfig = {
    endpoint: `${url.protocol}//${url.host}`,
    region: "us-east-1",
    forcePathStyle: true,
    credentials: {
      accessKeyId: decodeURIComponent(url.username) || process.env.AWS_ACCESS_KEY_ID || "",
      secretAccessKey: decodeURIComponent(url.password) || process.env.AWS_SECRET_ACCESS_KEY || "",
    },
  };
  const admin = new S3Client(config);
  // radosgw sends no Server header; its request ids start with "tx0". RUNNER_DEPOT_BENCH_S3_NAME overrides.
  const server =
    process.env.RUNNER_DEPOT_BENCH_S3_NAME ??
    (await fetch(config.endpoint as string).then(
      async (r) => {
        await r.body?.cancel();
        return r.headers.get("server") ?? (r.headers.get("x-amz-request-id")?.startsWith("tx0") ? "radosgw" : "S3");
      },
      () => "S3",
    ));
  const bucket = `bench-${randomUUID()}`;
  await admin.send(new CreateBucketCommand({ Bucket: bucket }));
  return {
    label: `${server} at ${url.host}`,
    config,
    bucket,
    verifies: verifiesEnv !== "0",
    async close() {
      for (let token: string | undefined; ;) {
        const page = await admin.send(new ListObjectsV2Command({ Bucket: bucket, ContinuationToken: token }));
        for (const o of page.Contents ?? []) await admin.send(new DeleteObjectCommand({ Bucket: bucket, Key: o.Key }));
        token = page.IsTruncated ? page.NextContinuationToken : undefined;
        if (!token) break;
      }
      await admin.send(new DeleteBucketCommand({ Bucket: bucket })).catch(() => {});
      admin.destroy();
    },
  };
}

const httpDigest = (hex: string) => `sha-256=:${Buffer.from(hex, "hex").toString("base64")}:`;

async function openTransaction(url: string, spec: string): Promise<string> {
  const response = await fetch(`${url}/trans/${spec}`, { method: "POST" });
  if (response.status !== 201) throw new Error(`open ${spec}: ${response.status}`);
  return ((await response.json()) as { transaction: string }).transaction;
}

/** S3: uploads (declared, undeclared, lib-storage), commits, archive copies, SHA-256 passes. */
async function measureS3(source: string) {
  const target = await s3Target();
  const db = await createTestSchema();
  const client = new S3Client(target.config);
  const store = composeStore({
    blobs: createS3BlobStore({
      bucket: target.bucket,
      prefix: "bench/",
      clientConfig: target.config,
      serverVerifiesPayload: target.verifies,
    }),
    records: createPostgresRecords({ pool: db.pool, schema: db.schema }),
  });
  const depot = await startDepotHere(store);
  // The same store without its local copies of uploads (upload-spool.ts): the commit reads the items back from S3.
  const readBackStore = composeStore({
    blobs: createS3BlobStore({
      bucket: target.bucket,
      prefix: "bench-read-back/",
      clientConfig: target.config,
      serverVerifiesPayload: target.verifies,
      spoolBytes: 0,
    }),
    records: createPostgresRecords({ pool: db.pool, schema: db.schema }),
  });
  const readBackDepot = await startDepotHere(readBackStore);
  const readBack: number[] = [];
  const coldCommits: number[] = [];
  const declared: number[] = [];
  const undeclared: number[] = [];
  const peer: number[] = [];
  const commits: number[] = [];
  const stored: number[] = [];
  const shas: number[] = [];
  /**
   * Uploads the file declared, then times its commit (and, with `storedTimes`, until its archive is
   * stored). Between the two the disk is settled; with `keepCache` the page cache is kept, as it is
   * right after an upload (the store's local copy of the item is then read from memory, not disk).
   */
  const commitTurn = async (url: string, spec: string, times: number[], storedTimes?: number[], keepCache = false) => {
    const hex = await freshen(source);
    const id = await openTransaction(url, spec);
    await curl(
      [
        "-X",
        "POST",
        "-T",
        source,
        "-H",
        "Pkg-Path: big.bin",
        "-H",
        `Content-Digest: ${httpDigest(hex)}`,
        `${url}/add/${id}/file`,
      ],
      201,
    );
    await settle(source, { keepCache });
    const start = performance.now();
    await curl(["-X", "POST", `${url}/commit/${id}`], 201);
    times.push(performance.now() - start);
    // Until the archive is stored: this process waits for its copy, then redirects (waited for
    // in every turn, so no copy runs into the next turn).
    const redirect = await fetch(`${url}/data/${spec}`, { redirect: "manual" });
    await redirect.body?.cancel();
    if (redirect.status !== 302) throw new Error(`archive of ${spec} not stored: ${redirect.status}`);
    storedTimes?.push(performance.now() - start);
  };
  try {
    const add = async (round: number, digestHeader: string | undefined, times: number[], spec: string) => {
      const id = await openTransaction(depot.url, spec);
      const headers = digestHeader ? ["-H", `Content-Digest: ${digestHeader}`] : [];
      const url = `${depot.url}/add/${id}/file`;
      times.push(
        await timed(() => curl(["-X", "POST", "-T", source, "-H", "Pkg-Path: big.bin", ...headers, url], 201)),
      );
      return id;
    };
    for (let round = 0; round < RUNS; round++) {
      const turns = [
        async () => {
          const hex = await freshen(source);
          await settle(source);
          const id = await add(round, httpDigest(hex), declared, `declared@1.0.${round}`);
          await fetch(`${depot.url}/trans/${id}`, { method: "DELETE" });
        },
        async () => {
          await freshen(source);
          await settle(source);
          const id = await add(round, undefined, undeclared, `undeclared@1.0.${round}`);
          await fetch(`${depot.url}/trans/${id}`, { method: "DELETE" });
        },
        async () => {
          await freshen(source);
          await settle(source);
          peer.push(
            await timed(() =>
              new Upload({
                client,
                params: { Bucket: target.bucket, Key: `peer/${round}.bin`, Body: createReadStream(source) },
              }).done(),
            ),
          );
        },
        () => commitTurn(depot.url, `big@1.0.${round}`, commits, stored, true),
        () => commitTurn(depot.url, `cold@1.0.${round}`, coldCommits),
        () => commitTurn(readBackDepot.url, `back@1.0.${round}`, readBack),
        async () => {
          await settle(source);
          shas.push(await timed(() => sha256Hex(source)));
        },
      ];
      for (let k = 0; k < turns.length; k++) await turns[(round + k) % turns.length]!();
    }
  } finally {
    await depot.close();
    await store.close?.();
    await readBackDepot.close();
    await readBackStore.close?.();
    client.destroy();
    await db.drop();
    await target.close();
  }
  return {
    label: target.label,
    verifies: target.verifies,
    declared,
    undeclared,
    peer,
    commits,
    stored,
    coldCommits,
    readBack,
    shas,
  };
}

/**
 * CPU time (user + system, every thread) of the processes `pids` and their children so far,
 * ms, from /proc (Linux; 0 elsewhere). O(threads).
 */
async function cpuMs(pids: number[]): Promise<number> {
  return (await cpuTicks(pids)) * 10; // USER_HZ is 100 on Linux
}

async function cpuTicks(pids: number[]): Promise<number> {
  let ticks = 0;
  for (const pid of pids) {
    const stat = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => "");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    // utime and stime are the 14th and 15th fields (12th and 13th after the name).
    ticks += Number(fields[11] ?? 0) + Number(fields[12] ?? 0);
    const children = await readFile(`/proc/${pid}/task/${pid}/children`, "utf8").catch(() => "");
    ticks += await cpuTicks(children.split(" ").filter(Boolean).map(Number));
  }
  return ticks;
}

/** fs store (fsync on, child process) `POST /add` against nginx `PUT` + `sync`, the disk settled before each. */
async function measureFs(work: string, source: string, installPeers: boolean) {
  const nginxBin = "/usr/sbin/nginx";
  const missing = await peerMissing(
    { name: "nginx", bin: nginxBin, aptPackage: "nginx", module: "depot-blob-uploads" },
    installPeers,
  );
  const children: ChildProcess[] = [];
  const ours: number[] = [];
  const mainThread: number[] = [];
  const theirs: number[] = [];
  // CPU time of the server process per upload (ours: the depot child; theirs: nginx's master and worker).
  const cpu = { ours: [] as number[], mainThread: [] as number[], theirs: [] as number[] };
  const withCpu = async (pid: number | undefined, into: number[], fn: () => Promise<void>) => {
    const before = pid ? await cpuMs([pid]) : 0;
    await fn();
    if (pid) into.push((await cpuMs([pid])) - before);
  };
  try {
    const depot = await startDepot(path.join(work, "store"), { hashOnWorker: true });
    children.push(depot.child);
    // The same store as configured by default: hashing on its main thread.
    const plain = await startDepot(path.join(work, "store-main-thread"));
    children.push(plain.child);
    const www = path.join(work, "www");
    await mkdir(www, { recursive: true });
    const nginx = missing ? undefined : await startNginx(nginxBin, work, www, { dav: true });
    if (nginx) children.push(nginx.child);
    for (let round = 0; round < RUNS; round++) {
      const upload = (server: { url: string; child: ChildProcess }, times: number[], cpuMsOf: number[]) => async () => {
        const url = server.url;
        await freshen(source);
        const id = await openTransaction(url, `fsup@1.0.${round}`);
        await settle(source);
        await withCpu(server.child.pid, cpuMsOf, async () => {
          times.push(
            await timed(() =>
              curl(["-X", "POST", "-T", source, "-H", "Pkg-Path: big.bin", `${url}/add/${id}/file`], 201),
            ),
          );
        });
        await fetch(`${url}/trans/${id}`, { method: "DELETE" });
      };
      const turns = [
        upload(depot, ours, cpu.ours),
        upload(plain, mainThread, cpu.mainThread),
        ...(nginx
          ? [
              async () => {
                await freshen(source);
                await settle(source);
                // Made durable as the depot makes its blob: the file and its directory flushed
                // (sync(1) with operands fsyncs each), not every dirty page of the shared machine.
                const put = path.join(www, "dav", `big-${round}.bin`);
                await withCpu(nginx.child.pid, cpu.theirs, async () => {
                  theirs.push(
                    await timed(async () => {
                      await curl(["-T", source, `${nginx.url}/dav/big-${round}.bin`], 201);
                      await run$("sync", [put, path.dirname(put)]);
                    }),
                  );
                });
              },
            ]
          : []),
      ];
      for (let k = 0; k < turns.length; k++) await turns[(round + k) % turns.length]!();
    }
    return { ours, mainThread, theirs, cpu, nginx: nginx?.version, missing };
  } finally {
    for (const child of children) await stop(child);
  }
}

/** The median over rounds of `peer[i] / ours[i]` (throughput ratio ours ÷ peer, turns of one round). */
const paired = (peer: number[], ours: number[]) => median(ours.map((ms, i) => peer[i]! / ms));

/** Runs the benchmark and returns its Markdown section. */
export async function run(options: { installPeers?: boolean } = {}): Promise<string> {
  const loadBefore = os.loadavg()[0]!;
  const work = await mkdtemp(path.join(os.tmpdir(), "bench-blob-uploads-"));
  try {
    const source = path.join(work, "source.bin");
    await makeFile(source);
    const s3 = FS_ONLY ? undefined : await measureS3(source);
    const fs = await measureFs(work, source, options.installPeers === true);
    const load = `${fmt(loadBefore, 1)} before, ${fmt(os.loadavg()[0]!, 1)} after`;
    const size = `${FILE_BYTES / MiB} MiB`;
    const s3Rows = (s3: Awaited<ReturnType<typeof measureS3>>) => {
      const shaMs = median(s3.shas);
      return [
        `| S3: upload of ${size}, digest declared (\`POST /add\` with \`Content-Digest\`: one PutObject to its content address${s3.verifies ? ", checked by the server" : ""}) | ${fmt(mbps(FILE_BYTES, median(s3.declared)))} MB/s | plain lib-storage \`Upload\` of the file | ${fmt(mbps(FILE_BYTES, median(s3.peer)))} MB/s | ${fmt(paired(s3.peer, s3.declared), 2)} | ≥ 0.8 |`,
        `| S3: upload of ${size}, no digest (multipart to a temporary key, server-side copy) | ${fmt(mbps(FILE_BYTES, median(s3.undeclared)))} MB/s | the same \`Upload\` | ${fmt(mbps(FILE_BYTES, median(s3.peer)))} MB/s | ${fmt(paired(s3.peer, s3.undeclared), 2)} | ≥ 0.8 |`,
        `| S3: commit of the ${size} version, answered (\`POST /commit\`: one hash pass over the items, read from the store's local copies of its uploads, in the page cache as right after the upload) | ${fmt(median(s3.commits))} ms | one SHA-256 pass over the file | ${fmt(shaMs)} ms | ${fmt(paired(s3.commits, s3.shas), 2)}× | ≤ 2× |`,
        `| the same commit with the page cache dropped between upload and commit (the local copy read from disk) | ${fmt(median(s3.coldCommits))} ms | one SHA-256 pass | ${fmt(shaMs)} ms | ${fmt(paired(s3.coldCommits, s3.shas), 2)}× | — |`,
        `| the same commit with the local copies off (\`spoolBytes: 0\`: the items read back from S3; page cache dropped) | ${fmt(median(s3.readBack))} ms | one SHA-256 pass | ${fmt(shaMs)} ms | ${fmt(paired(s3.readBack, s3.shas), 2)}× | — |`,
        `| S3: the same commit until its archive is stored (the copy after the answer: \`GET /data\` redirects) | ${fmt(median(s3.stored))} ms | one SHA-256 pass | ${fmt(shaMs)} ms | ${fmt(paired(s3.stored, s3.shas), 2)}× | — |`,
      ];
    };
    const rows = [
      ...(s3 ? s3Rows(s3) : []),
      ...(fs.theirs.length > 0
        ? [
            `| fs store (fsync on): upload of ${size} (\`POST /add\`, no digest), hashed on its main thread (the default) | ${fmt(mbps(FILE_BYTES, median(fs.mainThread)))} MB/s | nginx ${fs.nginx} WebDAV \`PUT\` + \`sync\` of the file and its directory | ${fmt(mbps(FILE_BYTES, median(fs.theirs)))} MB/s | ${fmt(paired(fs.theirs, fs.mainThread), 2)} | ≥ 0.8 |`,
            `| the same store hashing on its worker thread (\`hashOnWorker: true\`) | ${fmt(mbps(FILE_BYTES, median(fs.ours)))} MB/s | the same nginx \`PUT\` + \`sync\` | ${fmt(mbps(FILE_BYTES, median(fs.theirs)))} MB/s | ${fmt(paired(fs.theirs, fs.ours), 2)} | — |`,
            `| fs rounds, ms (main thread / worker / nginx + sync) | ${fs.mainThread.map((ms) => fmt(ms)).join(", ")} | ${fs.ours.map((ms) => fmt(ms)).join(", ")} | ${fs.theirs.map((ms) => fmt(ms)).join(", ")} | | |`,
            ...(fs.cpu.ours.length > 0
              ? [
                  `| fs: CPU time of the server per upload (user + system, all threads; median) | ${fmt(median(fs.cpu.mainThread))} ms (worker: ${fmt(median(fs.cpu.ours))} ms) | nginx (master + worker; \`sync\` not counted) | ${fmt(median(fs.cpu.theirs))} ms | ${fmt(median(fs.cpu.mainThread) / median(fs.cpu.theirs), 2)}× | — |`,
                ]
              : []),
          ]
        : [
            `| fs store (fsync on): upload of ${size} | ${fmt(mbps(FILE_BYTES, median(fs.ours)))} MB/s | nginx: skipped — ${fs.missing} | | | ≥ 0.8 |`,
          ]),
    ];
    return [
      "## Depot blob uploads: S3 and the fs store",
      "",
      `Method: a ${size} file of random bytes on ${os.tmpdir()}, its first 8 bytes new before each upload (bytes no store holds yet). S3: ${!s3 ? "not measured (BENCH_FS_ONLY=1)" : s3.label}${!s3 || s3.verifies ? "" : " (checks no payload hash: the store runs with `serverVerifiesPayload: false`, so a declared digest goes by multipart upload to its content address, checked by the depot)"}; the depot (\`servePackageRouter\`, PostgreSQL records) runs in the bench process, the S3 server in its own; curl is the depot's client; the peer is \`new Upload({ client, params: { Body: createReadStream(file) } })\` from \`@aws-sdk/lib-storage\` with its defaults (5 MiB parts, 4 at once), in the bench process. Commit: from \`POST /commit\` to its answer, and on to the moment its archive is stored (the redirect of \`GET /data\`, which waits for the copy this process started); between the upload and the commit the disk is settled (\`sync\`), the page cache kept for the first commit row and dropped for the other two; the SHA-256 pass is Node's \`createHash\` over the file from the page cache. fs store: \`createFsStore\` with fsync in a child process (test/fixtures/depot-client-server.ts), once hashing on its main thread (the default) and once on its worker thread (\`hashOnWorker: true\`), against nginx's WebDAV \`PUT\` followed by \`sync FILE DIR\` (coreutils: an fsync of the uploaded file and of its directory, as the depot flushes its blob and the directory it is renamed into; a bare \`sync\` would wait for every dirty page of this shared machine); before every turn the disk is settled: \`sync\`, the page cache dropped (${dropAllowed ? "allowed here" : "not allowed here: skipped"}), the source read back into it. The fs rows add the server's CPU time over each upload (user + system of every thread of the depot's process, or of nginx's master and worker, from /proc: curl's and \`sync\`'s are not counted) and every round's time. Contenders take turns within each of ${RUNS} rounds in an order rotating by round; each figure is the median, MB = 10⁶ bytes, ratio = the median over rounds of peer time ÷ ours (for a commit: ours ÷ the SHA-256 pass). ${os.cpus().length} cores, shared; 1-minute load average ${load}.`,
      "",
      "| measure | depot | peer | peer | ratio | aim |",
      "|---|---:|---|---:|---:|---|",
      ...rows,
    ].join("\n");
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}
