/**
 * Runner bench: follow() fan-out across two replicas and log archiving (issue 13, items 3
 * and 4). Two runner services share one PostgreSQL schema (replica A takes the jobs over
 * gRPC, followers sit on A and B), all in this process so one clock times every line.
 *
 * - Fan-out: 1,000 followers on 100 jobs (5 per job on each replica). Throughput: every
 *   job streams its lines as fast as it can; lines delivered/s = lines × followers ÷ time.
 *   Latency: each job writes 20 lines/s for 10 s; a line carries its send time and each
 *   follower notes when it got it; p50/p99 per replica. Peer: the same followers reading
 *   the store each for itself every 100 ms (a follower per reader, no shared tail, no events).
 * - Archive: one job of 64 MiB of build-log-like lines, PostgreSQL → S3 (s3rver):
 *   archive MB/s (of line bytes) against reading the same lines from PostgreSQL alone;
 *   object size against gzip -6 of the whole log as one stream; a 100-line tail read from
 *   the archive against the same read from PostgreSQL.
 */
import { randomUUID } from "node:crypto";
import { gzipSync } from "node:zlib";
import { createMemoryQueue } from "../src/adapters/memory/index.js";
import { createPostgresLogStore } from "../src/adapters/postgres/index.js";
import { createS3LogArchive } from "../src/adapters/s3/log-archive.js";
import { createRunnerService, startRunnerServer, type RunnerService } from "../src/runner/index.js";
import { createRunnerClient } from "../src/runner/client/runner-client.js";
import { createArchivingLogStore } from "../src/runner/archive/archiving-store.js";
import type { JobLogStore, StoredLine } from "../src/runner/ports.js";
import { logEntry, sampleJobResult } from "../src/testing/helpers.js";
import { createTestSchema, startS3 } from "../test/fixtures/backends.js";

const JOBS = Number(process.env.BENCH_FOLLOW_JOBS ?? 100);
const PER_JOB = Number(process.env.BENCH_FOLLOW_PER_JOB ?? 10);
const BURST_LINES = Number(process.env.BENCH_FOLLOW_LINES ?? 2_000);
const PACED_SECONDS = Number(process.env.BENCH_FOLLOW_SECONDS ?? 10);
const ARCHIVE_MIB = Number(process.env.BENCH_ARCHIVE_MIB ?? 64);

const now = () => performance.timeOrigin + performance.now();
const fmt = (n: number) => Math.round(n).toLocaleString("en-US");
const ms = (n: number) => (n < 10 ? n.toFixed(1) : fmt(n));

function quantile(sorted: number[], q: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
}

/** The peer follower: reads the store itself every `pollMs` until the job ended and it has every line. */
async function* pollingFollow(logs: JobLogStore, id: string, pollMs: number): AsyncGenerator<StoredLine> {
  let position = 0;
  for (;;) {
    const lines = await logs.read(id, position, 1024);
    for (const line of lines) yield line;
    position += lines.length;
    if (lines.length === 1024) continue;
    const state = await logs.get(id);
    if (state && state.status !== "open" && position >= state.storedLines) return;
    await new Promise((r) => setTimeout(r, pollMs));
  }
}

interface FanoutFigures {
  deliveredPerSecond: number;
  latency: { A: number[]; B: number[] };
}

/** One fan-out run: `follow` gives a follower's lines on replica A or B. */
async function fanout(
  url: string,
  a: RunnerService,
  follow: (replica: "A" | "B", id: string) => AsyncIterable<StoredLine>,
  paced: boolean,
): Promise<FanoutFigures> {
  const jobs = Array.from({ length: JOBS }, () => randomUUID());
  for (const id of jobs) await a.expectJob(id);
  const latency = { A: [] as number[], B: [] as number[] };
  let delivered = 0;
  const followers = jobs.flatMap((id) =>
    Array.from({ length: PER_JOB }, async (_, k) => {
      const replica = k % 2 === 0 ? "A" : "B";
      const sink = latency[replica];
      for await (const line of follow(replica, id)) {
        delivered++;
        if (paced) sink.push(now() - Number(line.line.slice(0, line.line.indexOf(" "))));
      }
    }),
  );
  await new Promise((r) => setTimeout(r, 500));
  const started = now();
  await Promise.all(
    jobs.map(async (id, j) => {
      const client = createRunnerClient({ endpoint: url, requestId: id });
      try {
        if (paced) {
          // 20 lines/s per job, phase-shifted so the 100 jobs do not tick together.
          await new Promise((r) => setTimeout(r, (j * 50) / JOBS));
          for (let i = 0; i < PACED_SECONDS * 20; i++) {
            client.log(`${now()} job ${j} line ${i} compiling src/module_${i % 97}.ts`);
            await new Promise((r) => setTimeout(r, 50));
          }
        } else {
          for (let i = 0; i < BURST_LINES; i++)
            client.log(`${now()} job ${j} line ${i} compiling src/module_${i % 97}.ts`);
        }
        await client.end({ exitCode: 0, success: true });
      } finally {
        await client.close();
      }
    }),
  );
  await Promise.all(followers);
  const seconds = (now() - started) / 1000;
  latency.A.sort((x, y) => x - y);
  latency.B.sort((x, y) => x - y);
  return { deliveredPerSecond: delivered / seconds, latency };
}

async function fanoutRows(): Promise<string[]> {
  const db = await createTestSchema();
  const storeA = createPostgresLogStore({ pool: db.pool, schema: db.schema });
  const storeB = createPostgresLogStore({ pool: db.pool, schema: db.schema });
  // When replica A has stored each line (the append committed): the part of the latency
  // that is the gRPC stream and PostgreSQL, not the fan-out.
  const stored: number[] = [];
  let recordStored = false;
  const a = createRunnerService(createMemoryQueue(), {
    logs: storeA,
    onLog: (event) => {
      if (!recordStored) return;
      const t = now();
      for (const line of event.lines) stored.push(t - Number(line.line.slice(0, line.line.indexOf(" "))));
    },
  });
  const b = createRunnerService(createMemoryQueue(), { logs: storeB });
  const server = await startRunnerServer(a, { port: 0 });
  try {
    const ours = (replica: "A" | "B", id: string) => (replica === "A" ? a : b).follow(id);
    const peer = (replica: "A" | "B", id: string) => pollingFollow(replica === "A" ? storeA : storeB, id, 100);
    const burstOurs = await fanout(server.url, a, ours, false);
    const burstPeer = await fanout(server.url, a, peer, false);
    recordStored = true;
    const pacedOurs = await fanout(server.url, a, ours, true);
    recordStored = false;
    stored.sort((x, y) => x - y);
    const pacedPeer = await fanout(server.url, a, peer, true);
    const row = (what: string, o: number, p: number, unit: string, f = fmt) =>
      `| ${what} | ${f(o)} ${unit} | ${f(p)} ${unit} | ${(o / p).toFixed(2)} |`;
    return [
      row(
        `lines delivered/s to ${JOBS * PER_JOB} followers (${JOBS} jobs × ${BURST_LINES} lines, as fast as written)`,
        burstOurs.deliveredPerSecond,
        burstPeer.deliveredPerSecond,
        "lines/s",
      ),
      `| latency p50 / p99 from the line's send to its append committed on A (the floor under every follower; same run as ours) | ${ms(quantile(stored, 0.5))} / ${ms(quantile(stored, 0.99))} ms | | |`,
      row(
        "latency p50, follower on the writing replica A",
        quantile(pacedOurs.latency.A, 0.5),
        quantile(pacedPeer.latency.A, 0.5),
        "ms",
        ms,
      ),
      row(
        "latency p99, follower on the writing replica A",
        quantile(pacedOurs.latency.A, 0.99),
        quantile(pacedPeer.latency.A, 0.99),
        "ms",
        ms,
      ),
      row(
        "latency p50, follower on replica B (across replicas)",
        quantile(pacedOurs.latency.B, 0.5),
        quantile(pacedPeer.latency.B, 0.5),
        "ms",
        ms,
      ),
      row(
        "latency p99, follower on replica B (across replicas)",
        quantile(pacedOurs.latency.B, 0.99),
        quantile(pacedPeer.latency.B, 0.99),
        "ms",
        ms,
      ),
    ];
  } finally {
    await server.close();
    await a.close();
    await b.close();
    await storeA.close?.();
    await storeB.close?.();
    await db.drop();
  }
}

/** A build-log-like line: compiler output, paths, numbers, the odd warning. */
function buildLine(i: number): string {
  const kinds = [
    `[${(i / 1000).toFixed(3)}s] CC src/module_${i % 211}/file_${i % 37}.c -o build/obj/${i % 211}_${i % 37}.o`,
    `  ok ${i} - test suite ${i % 53} case "${(i * 2654435761) % 100000}" (${i % 97} ms)`,
    `warning: unused variable 'tmp_${i % 19}' at src/module_${i % 211}/file_${i % 37}.c:${i % 900}:${i % 80}`,
    `Downloading https://registry.example.com/pkg-${i % 400}/-/pkg-${i % 400}-${i % 7}.${i % 13}.${i % 5}.tgz (${(i * 7919) % 900000} bytes)`,
  ];
  return kinds[i % kinds.length]!;
}

async function archiveRows(): Promise<string[]> {
  const db = await createTestSchema();
  const s3 = await startS3();
  const live = createPostgresLogStore({ pool: db.pool, schema: db.schema });
  const archive = createS3LogArchive({ bucket: s3.bucket, prefix: "bench/", client: s3.client });
  const logs = createArchivingLogStore(live, { archive, keepLiveMs: 3_600_000 });
  const id = randomUUID();
  try {
    let bytes = 0;
    let at = 0;
    const whole: string[] = [];
    while (bytes < ARCHIVE_MIB * 1024 * 1024) {
      const batch = [];
      for (let k = 0; k < 4096; k++) {
        const text = buildLine(at + k);
        batch.push(logEntry(text, k % 10 === 0));
        whole.push(text);
        bytes += Buffer.byteLength(text);
      }
      await live.append(id, at, batch);
      at += batch.length;
    }
    await live.finish(id, sampleJobResult({ requestId: id }), { at });
    // The peer: the same lines read back from PostgreSQL, page by page.
    let t = now();
    for (let from = 0; from < at;) from += (await live.read(id, from, 4096)).length;
    const readSeconds = (now() - t) / 1000;
    const peerTail = now();
    await live.read(id, at - 100, 100);
    const pgTailMs = now() - peerTail;
    t = now();
    const state = await logs.archiveJob(id);
    const archiveSeconds = (now() - t) / 1000;
    const info = state!.archived!;
    const gzipBytes = gzipSync(Buffer.from(`${whole.join("\n")}\n`), { level: 6 }).length;
    const cold = createArchivingLogStore(createPostgresLogStore({ pool: db.pool, schema: db.schema }), { archive });
    t = now();
    const tail = await cold.read(id, at - 100, 100);
    const tailMs = now() - t;
    if (tail.length !== 100 || tail[99]!.line !== whole[whole.length - 1]) throw new Error("archive tail differs");
    await cold.close();
    const mb = bytes / 1e6;
    return [
      `| archive a finished job of ${fmt(at)} lines (${mb.toFixed(0)} MB of line text), PostgreSQL → S3 | ${(mb / archiveSeconds).toFixed(1)} MB/s | reading it from PostgreSQL alone: ${(mb / readSeconds).toFixed(1)} MB/s | ${(readSeconds / archiveSeconds).toFixed(2)} |`,
      `| archive object size (${info.chunks} gzip chunks + index) | ${(info.bytes / 1e6).toFixed(2)} MB (${((100 * info.bytes) / bytes).toFixed(1)} % of the text) | gzip -6 of the whole log as one stream: ${(gzipBytes / 1e6).toFixed(2)} MB | ${(info.bytes / gzipBytes).toFixed(2)} |`,
      `| 100-line tail of the archived job, a cold reader (index + 1 chunk: 2 Range reads) | ${ms(tailMs)} ms | the same tail from PostgreSQL before archiving: ${ms(pgTailMs)} ms | ${(tailMs / pgTailMs).toFixed(2)} |`,
    ];
  } finally {
    await logs.close();
    await s3.close();
    await db.drop();
  }
}

/** Runs the bench; returns its BENCHMARKS.md section. */
export async function run(): Promise<string> {
  const fan = await fanoutRows();
  const arch = await archiveRows();
  return [
    "## Runner: follow() fan-out across replicas, log archive",
    "",
    `Method: two runner services on one PostgreSQL schema in one process (one clock for latency); ${JOBS} jobs streamed over gRPC into replica A, ${PER_JOB} followers per job, half on A and half on B (B hears of A's lines through LISTEN/NOTIFY). Throughput: every job writes ${fmt(BURST_LINES)} lines as fast as it can. Latency: each job writes 20 lines/s for ${PACED_SECONDS} s; latency is from the line's send time (in its text) to a follower's receipt. Peer: the same followers, each reading the store itself every 100 ms. Archive: one job of ${ARCHIVE_MIB} MiB of build-log-like lines (4,096-line appends), archived from PostgreSQL to S3 on in-process s3rver (local disk: adapter and format cost, not a network).`,
    "",
    "| case | ours | peer | ratio ours ÷ peer |",
    "|---|---|---|---|",
    ...fan,
    ...arch,
  ].join("\n");
}
