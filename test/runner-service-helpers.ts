/** Shared harness of the runner service/server tests: a real server, a real gRPC client. */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { ConnectError, createClient, type Client, type Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { LogItemSchema, Runner, type LogItem } from "../src/gen/runner/v1/runner_pb.js";
import { createRunnerService, startRunnerServer, type RunnerServer, type RunnerService, type RunnerServiceOptions, type RunnerServerSettings } from "../src/runner/index.js";
import { createMemoryQueue, type MemoryQueue } from "../src/adapters/memory/index.js";
import { createFsLogStore } from "../src/adapters/fs/index.js";
import type { JobLogStore } from "../src/runner/ports.js";

export interface Harness {
  queue: MemoryQueue;
  runner: RunnerService;
  server: RunnerServer;
  logs: JobLogStore;
  client: Client<typeof Runner>;
  transport: Transport;
  close(): Promise<void>;
}

/** Starts a service on 127.0.0.1:0 with an fs log store (default) and a gRPC client. */
export async function startHarness(
  options: RunnerServiceOptions & { memoryStore?: boolean; server?: RunnerServerSettings } = {},
): Promise<Harness> {
  const queue = createMemoryQueue();
  const dir = options.memoryStore ? null : mkdtempSync(join(tmpdir(), "runner-depot-svc-"));
  const logs = options.logs ?? (dir ? createFsLogStore(dir) : undefined);
  const runner = createRunnerService(queue, { ...options, logs });
  const server = await startRunnerServer(runner, { port: 0, ...options.server });
  const transport = createGrpcTransport({ baseUrl: server.url });
  const client = createClient(Runner, transport);
  return {
    queue,
    runner,
    server,
    logs: runner.logs,
    client,
    transport,
    async close() {
      await server.close();
      await runner.close();
      await runner.logs.close?.();
      if (dir) rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A log item. */
export function line(requestId: string, text: string, stderr = false): LogItem {
  return create(LogItemSchema, { requestId, event: { case: "log", value: { line: text, stderr } } });
}

/** An end item. */
export function end(requestId: string, exitCode = 0, success = exitCode === 0, repoUrl = "", commitSha = ""): LogItem {
  return create(LogItemSchema, { requestId, event: { case: "end", value: { exitCode, success, repoUrl, commitSha } } });
}

/** An item with neither log nor end. */
export function empty(requestId: string): LogItem {
  return create(LogItemSchema, { requestId });
}

/** What one StreamLogs call came to, as the runner sees it. */
export interface Outcome {
  ok: boolean | null;
  /** gRPC status name of the failure, null on success. */
  code: string | null;
  committed: string | null;
  reason: string | null;
  error: ConnectError | null;
}

async function* fromArray(items: LogItem[]): AsyncGenerator<LogItem> {
  for (const item of items) yield item;
}

/** Sends items in one call and reports the Ack or the error, with its trailers. */
export async function send(
  client: Client<typeof Runner>,
  items: LogItem[] | AsyncIterable<LogItem>,
  options: { token?: string; offset?: number | string; headers?: Record<string, string>; signal?: AbortSignal } = {},
): Promise<Outcome> {
  const headers: Record<string, string> = { ...options.headers };
  if (options.token !== undefined) headers.authorization = `Bearer ${options.token}`;
  if (options.offset !== undefined) headers["runner-offset"] = String(options.offset);
  let trailer: Headers | undefined;
  try {
    const ack = await client.streamLogs(Array.isArray(items) ? fromArray(items) : items, {
      headers,
      signal: options.signal,
      onTrailer: (t) => (trailer = t),
    });
    return { ok: ack.ok, code: null, committed: trailer?.get("runner-committed") ?? null, reason: trailer?.get("runner-reason") ?? null, error: null };
  } catch (e) {
    const error = ConnectError.from(e);
    const { Code } = await import("@connectrpc/connect");
    return {
      ok: null,
      code: Code[error.code]!,
      committed: error.metadata.get("runner-committed"),
      reason: error.metadata.get("runner-reason"),
      error,
    };
  }
}

/** Stored line texts of a job. */
export async function storedTexts(logs: JobLogStore, id: string): Promise<string[]> {
  return (await logs.read(id)).map((l) => l.line);
}

/** Polls `check` until it is true (a back door, never a timed assertion). */
export async function until(check: () => boolean | Promise<boolean>, what = "condition"): Promise<void> {
  for (let i = 0; i < 2000; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`gave up waiting for ${what}`);
}

/** A request stream the test drives item by item; `close()` ends it. */
export function controlledStream(): { items: AsyncIterable<LogItem>; push(item: LogItem): void; close(): void } {
  const queue: Array<LogItem | null> = [];
  let wake: (() => void) | null = null;
  return {
    push(item) {
      queue.push(item);
      wake?.();
    },
    close() {
      queue.push(null);
      wake?.();
    },
    items: {
      async *[Symbol.asyncIterator]() {
        for (;;) {
          while (queue.length === 0) await new Promise<void>((r) => (wake = r));
          wake = null;
          const next = queue.shift()!;
          if (next === null) return;
          yield next;
        }
      },
    },
  };
}
