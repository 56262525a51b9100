/**
 * Depot replicas (issue 28): one-file publishes per second at concurrency 8 and 32 on N depot
 * processes sharing one PostgreSQL schema (records) and one S3 bucket (blobs), with 1 and 2
 * replicas, each request of a publish (open, add, commit) sent to the next replica in turn;
 * the peer is the fs store (fsync on) in one process, measured in the same run. Also the
 * PostgreSQL statements per publish, counted in the replicas (reads, writes whose commit
 * waits for a WAL flush, asynchronous writes, flushes). S3 is s3rver in its own process
 * unless RUNNER_DEPOT_BENCH_S3 names another endpoint (test/fixtures/depot-replicas.ts).
 */
import os from "node:os";
import { performance } from "node:perf_hooks";
import { startDepot as startFsDepot, stop } from "./children.js";
import { createTestSchema } from "../test/fixtures/backends.js";
import { tempDir } from "../test/fixtures/depot.js";
import {
  freshPrefix,
  cpuBetween,
  machineCpu,
  replicaS3,
  roundRobin,
  startReplica,
  sumCounts,
  type Replica,
} from "../test/fixtures/depot-replicas.js";
import type { StatementCounts } from "../test/fixtures/depot-replica-server.js";

/** Publishes per cell; DEPOT_REPLICAS_PUBLISHES=64 for a quick trial. */
const PUBLISHES = Number(process.env.DEPOT_REPLICAS_PUBLISHES ?? 256);
const CONCURRENCY = [8, 32];
const fmt = (n: number, digits = 1) => n.toFixed(digits);
const load = () =>
  os
    .loadavg()
    .map((l) => l.toFixed(1))
    .join(" / ");

/** One publish of a one-file package, its three requests sent round-robin. */
async function publishOnce(rr: ReturnType<typeof roundRobin>, spec: string, body: string): Promise<void> {
  const opened = await rr.fetch(`/trans/${spec}`, { method: "POST" });
  if (opened.status !== 201) throw new Error(`open ${spec}: ${opened.status} ${await opened.text()}`);
  const { transaction } = (await opened.json()) as { transaction: string };
  const added = await rr.fetch(`/add/${transaction}/file`, { method: "POST", headers: { "Pkg-Path": "f" }, body });
  if (added.status !== 201) throw new Error(`add ${spec}: ${added.status} ${await added.text()}`);
  const committed = await rr.fetch(`/commit/${transaction}`, { method: "POST" });
  if (committed.status !== 201) throw new Error(`commit ${spec}: ${committed.status} ${await committed.text()}`);
  await committed.arrayBuffer();
}

/** Publishes per second of `count` packages at `concurrency` over `urls`. */
async function rate(urls: string[], concurrency: number, tag: string, count = PUBLISHES): Promise<number> {
  const rr = roundRobin(urls);
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < count) {
        const i = next++;
        await publishOnce(rr, `${tag}-${i}@1.0.0`, `${tag} ${i}\n`);
      }
    }),
  );
  return count / ((performance.now() - t0) / 1000);
}

/** CPU time (user + system, ms) a process used so far, from /proc; null without it. */
async function processCpuMs(pid: number | undefined): Promise<number | null> {
  const { readFile } = await import("node:fs/promises");
  const stat = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => "");
  const close = stat.lastIndexOf(")");
  if (pid === undefined || close < 0) return null;
  const fields = stat.slice(close + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) * 10; // USER_HZ 100: 10 ms a tick
}

interface Cell {
  rate: number;
  /** The fs store's own process: CPU ms per publish. */
  fsProcessMs?: number;
  load: string;
  perPublish?: StatementCounts;
  /** CPU ms per publish: the whole machine (every process, others' too) and the PostgreSQL server. */
  machine?: { busyMs: number; postgresMs: number; s3rverMs: number };
  /** The share of the machine's cores busy during the cell (any process). */
  busy?: number;
}

/** Machine CPU per publish and the share of the cores busy over a cell, from two {@link machineCpu} readings. */
function machineShare(
  before: Awaited<ReturnType<typeof machineCpu>>,
  after: Awaited<ReturnType<typeof machineCpu>>,
  wallMs: number,
): Pick<Cell, "machine" | "busy"> {
  if (!before || !after) return {};
  const used = cpuBetween(before, after);
  return {
    machine: {
      busyMs: used.busyMs / PUBLISHES,
      postgresMs: used.postgresMs / PUBLISHES,
      s3rverMs: used.s3rverMs / PUBLISHES,
    },
    busy: (after.busyMs - before.busyMs) / wallMs / os.cpus().length,
  };
}

/** Runs the benchmark; returns its Markdown section. */
export async function run(): Promise<string> {
  const started = new Date();
  const s3 = await replicaS3();
  const cells = new Map<string, Cell>();
  const dir = await tempDir("bench-replicas-fs-");
  try {
    // Taken in turns per concurrency (fs, 1 replica, 2 replicas), so load weighs on each alike.
    for (const concurrency of CONCURRENCY) {
      const fs = await startFsDepot(`${dir.dir}/c${concurrency}`);
      try {
        await rate([fs.url], 4, `warm-fs-${concurrency}`, 16);
        const cpuBefore = await machineCpu();
        const ownBefore = await processCpuMs(fs.child.pid);
        const t0 = performance.now();
        const measured = await rate([fs.url], concurrency, `fs-${concurrency}`);
        const share = machineShare(cpuBefore, await machineCpu(), performance.now() - t0);
        const ownAfter = await processCpuMs(fs.child.pid);
        const fsProcessMs = ownBefore !== null && ownAfter !== null ? (ownAfter - ownBefore) / PUBLISHES : undefined;
        cells.set(`fs ${concurrency}`, { rate: measured, load: load(), fsProcessMs, ...share });
      } finally {
        await stop(fs.child);
      }
      for (const replicas of [1, 2]) {
        const db = await createTestSchema();
        const prefix = await freshPrefix(s3, `bench-replicas-${replicas}-${concurrency}`);
        const running: Replica[] = [];
        try {
          for (let i = 0; i < replicas; i++) running.push(await startReplica(s3, db.schema, prefix));
          const urls = running.map((r) => r.url);
          await rate(urls, 4, `warm-${replicas}-${concurrency}`, 16);
          const before = sumCounts(await Promise.all(running.map((r) => r.stats())));
          const cpuBefore = await machineCpu();
          const t0 = performance.now();
          const measured = await rate(urls, concurrency, `pg-${replicas}-${concurrency}`);
          const share = machineShare(cpuBefore, await machineCpu(), performance.now() - t0);
          const after = sumCounts(await Promise.all(running.map((r) => r.stats())));
          const perPublish = Object.fromEntries(
            Object.entries(after).map(([k, v]) => [k, (v - before[k as keyof StatementCounts]) / PUBLISHES]),
          ) as unknown as StatementCounts;
          cells.set(`pg${replicas} ${concurrency}`, { rate: measured, load: load(), perPublish, ...share });
        } finally {
          for (const r of running) await r.stop();
          await db.drop();
        }
      }
    }
  } finally {
    await dir.cleanup();
    await s3.close();
  }
  const cpuOf = (cell: Cell) =>
    cell.machine
      ? `${fmt(cell.machine.busyMs)} ms on the machine (${fmt(cell.machine.postgresMs)} in PostgreSQL, ${fmt(cell.machine.s3rverMs)} in s3rver), cores ${fmt(100 * cell.busy!, 0)}% busy`
      : "—";
  const rows: string[] = [];
  for (const concurrency of CONCURRENCY) {
    const fs = cells.get(`fs ${concurrency}`)!;
    const one = cells.get(`pg1 ${concurrency}`)!;
    const two = cells.get(`pg2 ${concurrency}`)!;
    const fsOwn = fs.fsProcessMs !== undefined ? `${fmt(fs.fsProcessMs)} ms in the fs store's process; ` : "";
    rows.push(`| fs store, 1 process | ${concurrency} | ${fmt(fs.rate)} | — | — | ${fsOwn}${cpuOf(fs)} | ${fs.load} |`);
    for (const [label, cell] of [
      ["PostgreSQL + S3, 1 replica", one],
      ["PostgreSQL + S3, 2 replicas", two],
    ] as const) {
      const p = cell.perPublish!;
      const statements = `${fmt(p.reads)} reads, ${fmt(p.syncWrites)} flushed writes, ${fmt(p.asyncWrites)} async writes, ${fmt(p.flushes)} flushes; ${fmt(p.s3Requests)} S3 requests`;
      const vs =
        cell === two
          ? `${fmt(cell.rate / fs.rate, 2)} (2 ÷ 1 replica: ${fmt(two.rate / one.rate, 2)})`
          : fmt(cell.rate / fs.rate, 2);
      // Paired in CPU: the fs store's process against the depot processes and PostgreSQL (others' work in it too).
      const ours = p.cpuMs + (cell.machine?.postgresMs ?? 0);
      const cpuRatio =
        fs.fsProcessMs !== undefined && cell.machine
          ? `; fs process ÷ (depot + PostgreSQL): ${fmt(fs.fsProcessMs / ours, 2)}`
          : "";
      rows.push(
        `| ${label} | ${concurrency} | ${fmt(cell.rate)} | ${vs} | ${statements} | ${fmt(p.cpuMs)} ms in the depot processes; ${cpuOf(cell)}${cpuRatio} | ${cell.load} |`,
      );
    }
  }
  const minutes = (Date.now() - started.getTime()) / 60_000;
  return [
    "## Depot replicas on PostgreSQL + S3",
    "",
    `Method: ${PUBLISHES} one-file packages published per cell through real HTTP (open, add, commit), at concurrency 8 and 32, each request sent to the next process in turn. PostgreSQL + S3: 1 or 2 depot processes (test/fixtures/depot-replica-server.ts: \`servePackageRouter\` over \`composeStore(createS3BlobStore, createPostgresRecords)\`) on one fresh schema of the local PostgreSQL (synchronous_commit on) and one bucket on ${s3.label}. Peer: the fs store (fsync on) in one process (test/fixtures/depot-client-server.ts). Cells taken in turns per concurrency after 16 warm-up publishes each. Statements per publish: counted on the replicas' PostgreSQL clients, the pool's and the records store's pipelined connections alike (a flush is syncRecords' one synchronous update); S3 requests counted in the replicas' S3 clients, one per command. CPU per publish: the depot processes' own (process.cpuUsage), the fs store's process's own (/proc), the whole machine's, the PostgreSQL server's and s3rver's (/proc, every such process: other clients' work is in them), and how busy the cores were over the cell; the CPU ratio pairs the fs store's process with the depot processes plus PostgreSQL (what a publish costs when no S3 request is made), the figure that load bears on least. Load average (1 / 5 / 15 min) read after each cell; the machine has ${os.cpus().length} cores shared with other work. Module ${fmt(minutes)} min.`,
    "",
    "| store | concurrency | publishes/s | ratio to the fs store | PostgreSQL statements and S3 requests per publish | CPU per publish | load average |",
    "|---|---:|---:|---:|---|---|---|",
    ...rows,
  ].join("\n");
}
