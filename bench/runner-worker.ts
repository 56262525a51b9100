/**
 * Child process of bench/runner.ts: hosts one gRPC server so the client under test
 * and the server run on separate cores. `ours` = createRunnerService + startRunnerServer
 * (memory queue, the log store BENCH_LOG_STORE names (memory by default, fs, pg), token check on; `ours-connect`: the same without the gRPC
 * fast path, every call through connect-node); `grpc-js` = a plain @grpc/grpc-js server
 * loading the same proto that counts lines and acks; `connect-min` = a bare connect-node
 * handler that only counts and acks (the floor under any connect-node service); `lean-bytes`, `lean-frames` and
 * `lean-template` = bench/lean-pipeline.ts's server (the transport alone and the lean pipelines of bench/runner-line-time.ts).
 * Talks to its parent over IPC:
 * sends `{ port }` once listening, answers `"mem"` with memory figures after a GC.
 */
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import pg from "pg";
import { createFsLogStore } from "../src/adapters/fs/log-store.js";
import { createMemoryLogStore } from "../src/adapters/memory/log-store.js";
import { createPostgresLogStore } from "../src/adapters/postgres/log-store.js";
import { createMemoryQueue } from "../src/adapters/memory/queue.js";
import { AckSchema, Runner } from "../src/gen/runner/v1/runner_pb.js";
import { startRunnerServer } from "../src/runner/server/start-server.js";
import { createRunnerService } from "../src/runner/index.js";
import type { JobLogStore } from "../src/runner/ports.js";
import { startLeanServer, type LeanMode } from "./lean-pipeline.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const mode = process.argv[2];
const send = (m: unknown) => process.send?.(m);
const gc = (globalThis as { gc?: () => void }).gc;

function memory(active: number) {
  gc?.();
  gc?.();
  const m = process.memoryUsage();
  return { active, rss: m.rss, heapUsed: m.heapUsed, external: m.external, arrayBuffers: m.arrayBuffers };
}

/**
 * The log store named by BENCH_LOG_STORE (memory, fs with fsync on, or pg on a throw-away
 * schema of BENCH_POSTGRES_URL) and how to remove what it wrote.
 */
async function logStore(): Promise<{ logs: JobLogStore; cleanup(): Promise<void> }> {
  const kind = process.env.BENCH_LOG_STORE ?? "memory";
  if (kind === "fs") {
    const dir = await mkdtemp(path.join(tmpdir(), "rd-bench-logs-"));
    // BENCH_FS_FSYNC=0: the fs store without fsync (bench/runner-tail.ts, to tell the disk's share of a cost).
    const fsync = process.env.BENCH_FS_FSYNC !== "0";
    return { logs: createFsLogStore(dir, { fsync }), cleanup: () => rm(dir, { recursive: true, force: true }) };
  }
  if (kind === "pg") {
    const url = process.env.BENCH_POSTGRES_URL ?? "postgres://postgres@127.0.0.1:5432/test";
    const schema = `rd_bench_${process.pid}_${Date.now().toString(36)}`;
    const pool = new pg.Pool({ connectionString: url, max: Number(process.env.BENCH_PG_POOL ?? 10) });
    pool.on("error", () => undefined);
    return {
      logs: createPostgresLogStore({ pool, schema }),
      async cleanup() {
        await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
        await pool.end();
      },
    };
  }
  // BENCH_POOLED_BLOCKS: the memory store's pool of let-go blocks (bench/runner-line-time.ts pairs it with 0).
  const pooledBlocks = process.env.BENCH_POOLED_BLOCKS;
  return {
    logs: createMemoryLogStore(pooledBlocks === undefined ? {} : { pooledBlocks: Number(pooledBlocks) }),
    cleanup: async () => undefined,
  };
}

/** BENCH_STORE_TIMING=1: counts appends and the time spent in them (printed at exit), to see whether the store is the wait. */
function timed(logs: JobLogStore): JobLogStore {
  if (!process.env.BENCH_STORE_TIMING) return logs;
  let n = 0;
  let items = 0;
  let ms = 0;
  const append = logs.append.bind(logs);
  logs.append = async (id, at, entries, now) => {
    const t0 = performance.now();
    try {
      return await append(id, at, entries, now);
    } finally {
      n++;
      items += entries.length;
      ms += performance.now() - t0;
    }
  };
  process.on("exit", () => console.error(`store: ${n} appends, ${items} items, ${ms.toFixed(0)} ms in append`));
  return logs;
}

if (mode === "ours" || mode === "ours-connect") {
  const store = await logStore();
  store.logs = timed(store.logs);
  const runner = createRunnerService(createMemoryQueue(), {
    logs: store.logs,
    secret: process.env.BENCH_SECRET ?? "bench",
    // bench/runner-tail.ts: the job-log limits under test (JSON), e.g. {"jobLogBytes":1048576,"tailBytes":0}.
    ...(process.env.BENCH_LIMITS ? { limits: JSON.parse(process.env.BENCH_LIMITS) as Record<string, number> } : {}),
  });
  // ours-connect: the same service with every call through connect-node (no gRPC fast path).
  const server = await startRunnerServer(runner, { port: 0, maxConcurrentStreams: 2000, fastPath: mode === "ours" });
  let prunedBefore = new Date(0);
  process.on("message", async (m) => {
    if (m === "mem") send(memory(runner.activeCalls));
    // bench/runner-masking.ts: a job registered with its secrets (the service masks them too).
    if (m === "cpu") send({ cpu: process.cpuUsage() });
    // bench/runner-tail.ts: forget the jobs that ended before the last prune, so a long-lived server holds one ended
    // job at most (the memory store's peer would otherwise hold every 64 MiB job). The newest stays, as a running
    // server keeps its ended jobs; no forced collection: gc() made V8 drop and recompile its optimized code in every
    // job (docs/decisions/log-tail.md, "Session of 2026-11-30").
    if (m === "prune") {
      const pruned = (await store.logs.prune?.(prunedBefore)) ?? 0;
      prunedBefore = new Date();
      send({ pruned });
    }
    if (typeof m === "object" && m !== null && "expect" in m) {
      const { expect, secrets } = m as { expect: string; secrets: string[] };
      await runner.expectJob(expect, { secrets });
      send({ expected: expect });
    }
    if (m === "exit") {
      await server.close();
      await runner.close();
      await store.logs.close?.();
      await store.cleanup();
      process.exit(0);
    }
  });
  send({ port: server.port });
} else if (mode === "connect-min") {
  // The floor of a connect-node server: decode every message, count, ack. No auth, no store.
  const adapter = connectNodeAdapter({
    routes: (router) =>
      router.service(Runner, {
        async streamLogs(requests, ctx) {
          let n = Number(ctx.requestHeader.get("runner-offset") ?? 0);
          for await (const _item of requests) n++;
          ctx.responseTrailer.set("runner-committed", String(n));
          return create(AckSchema, { ok: true });
        },
      }),
  });
  const server = http2.createServer(adapter);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  process.on("message", (m) => {
    if (m === "mem") send(memory(0));
    if (m === "exit") process.exit(0);
  });
  send({ port: (server.address() as AddressInfo).port });
} else if (
  mode === "lean-bytes" ||
  mode === "lean-frames" ||
  mode === "lean-template" ||
  mode === "lean-runs" ||
  mode === "lean-fields"
) {
  // bench/runner-line-time.ts: the transport alone and the lean pipelines (bench/lean-pipeline.ts).
  const lean = await startLeanServer(mode.slice("lean-".length) as LeanMode);
  process.on("message", async (m) => {
    if (m === "cpu") send({ cpu: process.cpuUsage() });
    if (m === "exit") {
      await lean.close();
      process.exit(0);
    }
  });
  send({ port: lean.port });
} else if (mode === "grpc-js") {
  const def = protoLoader.loadSync(path.join(here, "..", "proto", "runner", "v1", "runner.proto"), {
    defaults: true,
    oneofs: true,
  });
  const pkg = grpc.loadPackageDefinition(def) as unknown as {
    runner: { v1: { Runner: { service: grpc.ServiceDefinition } } };
  };
  let active = 0;
  const server = new grpc.Server({ "grpc.max_concurrent_streams": 2000 });
  server.addService(pkg.runner.v1.Runner.service, {
    StreamLogs(
      call: grpc.ServerReadableStream<{ log?: unknown; end?: unknown }, { ok: boolean }>,
      cb: grpc.sendUnaryData<{ ok: boolean }>,
    ) {
      active++;
      let lines = 0;
      call.on("data", (item) => {
        if (item.log) lines++;
      });
      call.on("end", () => cb(null, { ok: lines >= 0 }));
      call.on("close", () => active--);
      call.on("error", () => undefined);
    },
  });
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))),
  );
  process.on("message", (m) => {
    if (m === "mem") send(memory(active));
    if (m === "exit") server.tryShutdown(() => process.exit(0));
  });
  send({ port });
} else {
  console.error(`unknown mode ${mode}`);
  process.exit(2);
}
