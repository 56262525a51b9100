/**
 * S3 servers benchmark (issue 28, "measure first"): s3rver in its own process against the
 * radosgw of a one-node Ceph cluster (test/setup/ceph-rgw.sh, named by RUNNER_DEPOT_TEST_S3),
 * same run, same AWS SDK client in this process. Large objects (64 and 256 MiB): PUT as the
 * adapter does (lib-storage Upload, 8 MiB parts, 4 in flight) and as one PutObject whose
 * payload hash is sent (x-amz-content-sha256 = the known SHA-256, so the SDK does not hash
 * it again); GET streamed. Small objects: 4 KiB PutObject at concurrency 1, 8 and 32. Each
 * row also gives the CPU seconds of this process and of each server process, which says
 * what bounds the row. Without RUNNER_DEPOT_TEST_S3 only s3rver is measured.
 * Why and what follows: docs/decisions/s3-servers.md.
 */
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { open, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { GetObjectCommand, PutObjectCommand, S3Client } from "@aws-sdk/client-s3";
import { Upload } from "@aws-sdk/lib-storage";
import { createPostgresRecords } from "../src/adapters/postgres/index.js";
import { createS3BlobStore } from "../src/adapters/s3/index.js";
import { composeStore } from "../src/depot/store/compose.js";
import { patternBytes } from "../src/testing/helpers.js";
import { featureTable, probeFeatures, type Verdict } from "../scripts/s3-features.js";
import { createTestSchema, startExternalS3, startS3rver, type S3Fixture } from "../test/fixtures/backends.js";
import { publish, startDepot } from "../test/fixtures/depot.js";

const MiB = 1024 * 1024;
const LARGE = [64 * MiB, 256 * MiB];
const TURNS = 3;
const SMALL_BYTES = 4096;
const SMALL_PUTS = 320;
const CONCURRENCY = [1, 8, 32];

interface Server {
  name: string;
  s3: S3Fixture;
  /** The server's processes by name (CPU is read from /proc). */
  pids: Map<string, number>;
}

/** CPU seconds (user + system) of a process so far, from /proc/<pid>/stat. */
async function cpuSeconds(pid: number): Promise<number> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(fields[11]) + Number(fields[12])) / 100; // utime, stime in clock ticks (USER_HZ = 100)
  } catch {
    return NaN;
  }
}

interface Cpu {
  client: number;
  server: Map<string, number>;
}

/** Runs `work`; returns its wall time in ms and the CPU seconds each side spent. */
async function measured(server: Server, work: () => Promise<void>): Promise<{ ms: number; cpu: Cpu }> {
  const before = new Map<string, number>();
  for (const [name, pid] of server.pids) before.set(name, await cpuSeconds(pid));
  const client0 = process.cpuUsage();
  const t0 = performance.now();
  await work();
  const ms = performance.now() - t0;
  const clientUsage = process.cpuUsage(client0);
  const after = new Map<string, number>();
  for (const [name, pid] of server.pids) after.set(name, (await cpuSeconds(pid)) - before.get(name)!);
  return { ms, cpu: { client: (clientUsage.user + clientUsage.system) / 1e6, server: after } };
}

/** The ceph daemons' pids from the pid files ceph-rgw.sh's cluster writes. */
async function cephPids(): Promise<Map<string, number>> {
  const run = path.join(process.env.RUNNER_DEPOT_CEPH_DIR ?? "/var/lib/runner-depot-ceph", "run");
  const pids = new Map<string, number>();
  for (const [name, file] of [
    ["radosgw", "client.rgw.a.pid"],
    ["osd", "osd.0.pid"],
    ["mon", "mon.a.pid"],
  ] as const) {
    const at = path.join(run, file);
    if (existsSync(at)) pids.set(name, Number((await readFile(at, "utf8")).trim()));
  }
  return pids;
}

async function putUpload(server: Server, key: string, body: Buffer): Promise<void> {
  await new Upload({
    client: server.s3.client,
    params: { Bucket: server.s3.bucket, Key: key, Body: body },
    partSize: 8 * MiB,
    queueSize: 4,
  }).done();
}

/** One PutObject whose signed payload hash is given, as a declared digest would be. */
async function putSigned(server: Server, key: string, body: Buffer, sha256Hex: string): Promise<void> {
  const command = new PutObjectCommand({ Bucket: server.s3.bucket, Key: key, Body: body });
  command.middlewareStack.add(
    (next) => async (args) => {
      (args.request as { headers: Record<string, string> }).headers["x-amz-content-sha256"] = sha256Hex;
      return next(args);
    },
    { step: "build", name: "declaredPayloadHash" },
  );
  await server.s3.client.send(command);
}

async function getAll(server: Server, key: string, size: number): Promise<void> {
  const out = await server.s3.client.send(new GetObjectCommand({ Bucket: server.s3.bucket, Key: key }));
  let got = 0;
  for await (const chunk of out.Body as AsyncIterable<Uint8Array>) got += chunk.byteLength;
  if (got !== size) throw new Error(`GET ${key}: ${got} bytes, expected ${size}`);
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const quantile = (xs: number[], q: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
};
const fmt = (n: number, digits = n >= 100 ? 0 : 1) => (Number.isFinite(n) ? n.toFixed(digits) : "–");

/** CPU per unit of work (ms per MiB or per PUT) of the client and of each server process. */
function cpuText(cpu: Cpu, units: number): string {
  const per = (seconds: number) => fmt((seconds * 1000) / units, 2);
  const server = [...cpu.server].map(([name, s]) => `${name} ${per(s)}`).join(", ");
  return `${per(cpu.client)} | ${server}`;
}

/**
 * The rate the server's CPU alone would allow: s3rver is one Node thread, so one core over
 * its CPU per unit; radosgw and the OSD are threaded, so the machine's cores over the sum
 * of theirs (the mon's is noise).
 */
function serverCeiling(row: Row): number {
  const spent = [...row.cpu.server.values()].reduce((a, b) => a + b, 0);
  const cores = row.server === "s3rver" ? 1 : os.cpus().length;
  const perSecond = (cores * row.units) / spent; // MiB/s or PUT/s
  return row.unit === "MB/s" ? perSecond * 1.048576 : perSecond;
}

interface Row {
  case: string;
  server: string;
  value: number;
  unit: string;
  extra: string;
  cpu: Cpu;
  /** The units of work the CPU figures cover (MiB moved, or PUTs). */
  units: number;
}

/** Large objects: each turn runs every server once per case, so load drifts alike. */
async function largeRows(servers: Server[]): Promise<Row[]> {
  const rows: Row[] = [];
  for (const size of LARGE) {
    const body = patternBytes(size, size / MiB);
    const hex = createHash("sha256").update(body).digest("hex");
    const cases = [
      { name: "PUT, Upload 8 MiB × 4", put: (s: Server, key: string) => putUpload(s, key, body) },
      { name: "PUT, one PutObject, payload hash given", put: (s: Server, key: string) => putSigned(s, key, body, hex) },
    ];
    for (const [index, c] of cases.entries()) {
      const results = new Map<string, { ms: number; cpu: Cpu }[]>();
      const gets = new Map<string, { ms: number; cpu: Cpu }[]>();
      for (let turn = 0; turn < TURNS; turn++) {
        for (const server of servers) {
          const key = `large/${size}/${index}/${turn}`;
          const put = await measured(server, () => c.put(server, key));
          (results.get(server.name) ?? results.set(server.name, []).get(server.name)!).push(put);
          if (c === cases[0]) {
            const get = await measured(server, () => getAll(server, key, size));
            (gets.get(server.name) ?? gets.set(server.name, []).get(server.name)!).push(get);
          }
        }
      }
      const label = `${size / MiB} MiB`;
      for (const [name, turns] of results) rows.push(largeRow(`${c.name}, ${label}`, name, size, turns));
      for (const [name, turns] of gets) rows.push(largeRow(`GET (streamed), ${label}`, name, size, turns));
    }
  }
  return rows;
}

function largeRow(what: string, server: string, size: number, turns: { ms: number; cpu: Cpu }[]): Row {
  const mbs = turns.map((t) => size / 1e6 / (t.ms / 1000));
  const mid = turns[mbs.indexOf(median(mbs))]!;
  return {
    case: what,
    server,
    value: median(mbs),
    unit: "MB/s",
    extra: `${fmt(Math.min(...mbs))}–${fmt(Math.max(...mbs))}`,
    cpu: mid.cpu,
    units: size / MiB,
  };
}

/** Small PUTs: `SMALL_PUTS` 4 KiB objects with `concurrency` in flight; ops/s and latency. */
async function smallRows(servers: Server[]): Promise<Row[]> {
  const rows: Row[] = [];
  const body = patternBytes(SMALL_BYTES, 4);
  for (const concurrency of CONCURRENCY) {
    for (const server of servers) {
      // A few warm-up requests: connections and the SDK's first-call set-up.
      for (let i = 0; i < 8; i++)
        await server.s3.client.send(new PutObjectCommand({ Bucket: server.s3.bucket, Key: `warm/${i}`, Body: body }));
      const latencies: number[] = [];
      let next = 0;
      const { ms, cpu } = await measured(server, async () => {
        await Promise.all(
          Array.from({ length: concurrency }, async () => {
            while (next < SMALL_PUTS) {
              const key = `small/${concurrency}/${next++}`;
              const t0 = performance.now();
              await server.s3.client.send(new PutObjectCommand({ Bucket: server.s3.bucket, Key: key, Body: body }));
              latencies.push(performance.now() - t0);
            }
          }),
        );
      });
      rows.push({
        case: `PUT 4 KiB, concurrency ${concurrency}`,
        server: server.name,
        value: SMALL_PUTS / (ms / 1000),
        unit: "PUT/s",
        extra: `${fmt(median(latencies), 1)} / ${fmt(quantile(latencies, 0.99), 1)} ms`,
        cpu,
        units: SMALL_PUTS,
      });
    }
  }
  return rows;
}

function table(rows: Row[], servers: Server[]): string[] {
  const peer = servers[0]!.name;
  const lines = [
    "| case | server | rate | spread (large) or latency p50 / p99 (small) | ratio to s3rver | client CPU ms per MiB or PUT | server CPU ms per MiB or PUT | server-CPU ceiling |",
    "|---|---|---:|---:|---:|---:|---|---:|",
  ];
  for (const row of rows) {
    const base = rows.find((r) => r.case === row.case && r.server === peer)!;
    const ratio = row.server === peer ? "1.00" : (row.value / base.value).toFixed(2);
    lines.push(
      `| ${row.case} | ${row.server} | ${fmt(row.value)} ${row.unit} | ${row.extra} | ${ratio} | ${cpuText(row.cpu, row.units)} | ${fmt(serverCeiling(row))} ${row.unit} |`,
    );
  }
  return lines;
}

/** Median and p99 ms of a 4 KiB write + fdatasync in `dir` (the disk's durable-write latency). */
async function syncLatency(dir: string, count = 100): Promise<{ p50: number; p99: number }> {
  const file = path.join(dir, `sync-probe-${process.pid}`);
  const handle = await open(file, "w");
  const block = Buffer.alloc(4096, 1);
  const ms: number[] = [];
  try {
    for (let i = 0; i < count; i++) {
      const t0 = performance.now();
      await handle.write(block, 0, block.length, (i % 64) * 4096);
      await handle.datasync();
      ms.push(performance.now() - t0);
    }
  } finally {
    await handle.close();
    await rm(file, { force: true });
  }
  return { p50: median(ms), p99: quantile(ms, 0.99) };
}

const PUBLISHES: [concurrency: number, count: number][] = [
  [1, 30],
  [8, 80],
];

/**
 * One-file publishes (open, add, commit over HTTP) on PostgreSQL records + this server's
 * blobs, as the code stands: publishes/s at concurrency 1 and 8, the median publish at 1,
 * and the S3 requests one publish makes, by command (counted in the SDK client).
 */
async function publishRow(server: Server): Promise<string> {
  const counts = new Map<string, number>();
  const client = new S3Client(server.s3.clientConfig!);
  client.middlewareStack.add(
    (next, context) => async (args) => {
      counts.set(context.commandName!, (counts.get(context.commandName!) ?? 0) + 1);
      return next(args);
    },
    { step: "initialize", name: "countCommands" },
  );
  // s3rver removes a folder when its last object goes, racing an upload into it (see depot-scale.ts).
  await client.send(new PutObjectCommand({ Bucket: server.s3.bucket, Key: "publish/tmp/.keep", Body: "" }));
  const db = await createTestSchema();
  const store = composeStore({
    blobs: createS3BlobStore({ bucket: server.s3.bucket, prefix: "publish/", client }),
    records: createPostgresRecords({ pool: db.pool, schema: db.schema }),
  });
  const depot = await startDepot(store);
  try {
    const rates: string[] = [];
    let latencies: number[] = [];
    for (const [concurrency, count] of PUBLISHES) {
      let next = 0;
      const each: number[] = [];
      const t0 = performance.now();
      await Promise.all(
        Array.from({ length: concurrency }, async () => {
          while (next < count) {
            const i = next++;
            const t = performance.now();
            const response = await publish(depot.url, `p${concurrency}-${i}@1.0.0`, [
              { type: "file", path: "f", body: `${i}\n` },
            ]);
            if (response.status !== 201) throw new Error(`publish: ${response.status} ${await response.text()}`);
            await response.arrayBuffer();
            each.push(performance.now() - t);
          }
        }),
      );
      rates.push(`${fmt(count / ((performance.now() - t0) / 1000))}/s`);
      if (concurrency === 1) latencies = each;
    }
    counts.clear();
    const sample = 10;
    for (let i = 0; i < sample; i++) {
      const response = await publish(depot.url, `count-${i}@1.0.0`, [{ type: "file", path: "f", body: `${i}\n` }]);
      if (response.status !== 201) throw new Error(`publish: ${response.status}`);
      await response.arrayBuffer();
    }
    const total = [...counts.values()].reduce((a, b) => a + b, 0) / sample;
    const by = [...counts]
      .sort((a, b) => b[1] - a[1])
      .map(([name, n]) => `${name.replace(/Command$/, "")} ${fmt(n / sample, 1)}`)
      .join(", ");
    return `| ${server.name} | ${rates.join(" | ")} | ${fmt(median(latencies), 1)} ms | ${fmt(total, 1)}: ${by} |`;
  } finally {
    await depot.close();
    await store.close?.();
    client.destroy();
    await db.drop();
  }
}

/** Runs the benchmark; returns its Markdown section. */
export async function run(): Promise<string> {
  const loadBefore = os.loadavg();
  const started = new Date().toISOString().slice(11, 16);
  const servers: Server[] = [];
  try {
    const s3rver = await startS3rver();
    servers.push({ name: "s3rver", s3: s3rver, pids: new Map([["s3rver", s3rver.pid!]]) });
    const rgw = await startExternalS3();
    if (rgw) servers.push({ name: "radosgw", s3: rgw, pids: await cephPids() });
    const verdicts: { name: string; verdicts: Verdict[] }[] = [];
    for (const server of servers) verdicts.push({ name: server.name, verdicts: await probeFeatures(server.s3) });
    const cephDir = process.env.RUNNER_DEPOT_CEPH_DIR ?? "/var/lib/runner-depot-ceph";
    const sync = await syncLatency(rgw && existsSync(cephDir) ? cephDir : os.tmpdir());
    const rows = [...(await smallRows(servers)), ...(await largeRows(servers))];
    const publishes: string[] = [];
    for (const server of servers) publishes.push(await publishRow(server));
    const loadAfter = os.loadavg();
    const load = (l: number[]) => l.map((x) => x.toFixed(2)).join(", ");
    return [
      "## S3 servers: s3rver and radosgw",
      "",
      "Method: s3rver 3.7 in its own Node process (files on local disk, no fsync) and, when `RUNNER_DEPOT_TEST_S3` names it, " +
        "radosgw 16.2.15 of a one-node Ceph cluster (test/setup/ceph-rgw.sh: one OSD, bluestore on a sparse file on the same disk, " +
        "pools of one copy; bluestore acknowledges a write once it is durable). One `@aws-sdk/client-s3` client in the bench " +
        "process, path-style, plain HTTP on loopback. Small: " +
        `${SMALL_PUTS} PutObject of 4 KiB at each concurrency (after 8 warm-up puts), rate and per-request latency. ` +
        `Large: ${TURNS} turns, each server in turn within a turn; the median turn is shown with the spread of the turns. ` +
        "`Upload` is `@aws-sdk/lib-storage` as the adapter uses it (8 MiB parts, 4 in flight; the SDK hashes each part to sign it); " +
        "`payload hash given` is one PutObject with `x-amz-content-sha256` set to the body's SHA-256 (computed before the clock " +
        "starts, as a declared digest is known), which the server checks and the SDK then does not compute. GET reads the body " +
        "as a stream and counts it. CPU: user + system seconds over the row (the median turn for large ones) of the bench " +
        "process (the client) and of each server process (/proc/<pid>/stat); a side whose CPU seconds approach the wall time " +
        "is what bounds the row. The machine is shared (2 cores, other engineers' work running): load average " +
        `${load(loadBefore)} (1, 5, 15 min) at the start (${started} UTC), ${load(loadAfter)} at the end.` +
        (rgw
          ? ""
          : " **radosgw not measured**: RUNNER_DEPOT_TEST_S3 unset (run test/setup/ceph-rgw.sh and source its s3.env)."),
      "",
      ...table(rows, servers),
      "",
      `The disk under the OSD's file: a 4 KiB write + \`fdatasync\` takes ${fmt(sync.p50, 2)} ms median, ${fmt(sync.p99, 2)} ms p99 ` +
        "(100 in a row, same run). Server-CPU ceiling: the rate the server's own CPU per unit allows — s3rver is one Node " +
        "thread (one core), radosgw and the OSD are threaded (both cores); the client's CPU per unit bounds it the same way.",
      "",
      "Depot publishes on PostgreSQL records + each server's blobs, the code as it stands (one-file packages over HTTP: open, add, " +
        `commit; ${PUBLISHES.map(([c, n]) => `${n} at concurrency ${c}`).join(", ")}; then 10 more at concurrency 1 with the ` +
        "S3 requests counted by command in the SDK client):",
      "",
      `| server | ${PUBLISHES.map(([c]) => `publishes/s at ${c}`).join(" | ")} | median publish at 1 | S3 requests per publish |`,
      `|---|${PUBLISHES.map(() => "---:").join("|")}|---:|---|`,
      ...publishes,
      "",
      "What each server verifies (scripts/s3-features.ts, same run):",
      "",
      featureTable(verdicts),
    ].join("\n");
  } finally {
    for (const server of servers) await server.s3.close();
  }
}
