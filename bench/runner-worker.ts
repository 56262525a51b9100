/**
 * Child process of bench/runner.ts: hosts one gRPC server so the client under test
 * and the server run on separate cores. `ours` = createRunnerService + startRunnerServer
 * (memory queue and log store, token check on; `ours-connect`: the same without the gRPC
 * fast path, every call through connect-node); `grpc-js` = a plain @grpc/grpc-js server
 * loading the same proto that counts lines and acks; `connect-min` = a bare connect-node
 * handler that only counts and acks (the floor under any connect-node service). Talks to its parent over IPC:
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
import { createMemoryLogStore } from "../src/adapters/memory/log-store.js";
import { createMemoryQueue } from "../src/adapters/memory/queue.js";
import { AckSchema, Runner } from "../src/gen/runner/v1/runner_pb.js";
import { startRunnerServer } from "../src/runner/server.js";
import { createRunnerService } from "../src/runner/service.js";

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

if (mode === "ours" || mode === "ours-connect") {
  const runner = createRunnerService(createMemoryQueue(), { logs: createMemoryLogStore(), secret: process.env.BENCH_SECRET ?? "bench" });
  // ours-connect: the same service with every call through connect-node (no gRPC fast path).
  const server = await startRunnerServer(runner, { port: 0, maxConcurrentStreams: 2000, fastPath: mode === "ours" });
  process.on("message", async (m) => {
    if (m === "mem") send(memory(runner.activeCalls));
    if (m === "exit") {
      await server.close();
      await runner.close();
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
    StreamLogs(call: grpc.ServerReadableStream<{ log?: unknown; end?: unknown }, { ok: boolean }>, cb: grpc.sendUnaryData<{ ok: boolean }>) {
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
