/**
 * A host's unit tests, written the way runner-depot suggests: the in-memory adapters
 * stand in for RabbitMQ and the package store, the runner service is called in-process
 * through connect's router transport, the depot through `depot.fetch(Request)`, and the
 * host's own PackageStore adapter runs the library's conformance suite.
 *
 *   npx vitest run --root examples/host-unit-test
 *
 * (The project's own `vitest run` collects test/**\/*.test.ts only, so these never run twice.)
 * Imports name the package, as in a host (in a clone, tsconfig.json's `paths` map them to src/).
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, createRouterTransport } from "@connectrpc/connect";
import { parse as parseYaml } from "yaml";
import { describe, expect, it } from "vitest";
import { createMemoryQueue, createMemoryStore } from "runner-depot/adapters/memory";
import { createPackageRouter } from "runner-depot/depot";
import { LogItemSchema, Runner, type LogItem } from "runner-depot";
import { createRunnerService, mintJobToken } from "runner-depot/runner";
import { describePackageStore, describeQueueAdapter } from "runner-depot/testing";
import { launchJob } from "./orchestrator.js";
import { createTenantStore } from "./tenant-store.js";

// The host's own adapter, held to the same contract as the shipped ones.
describePackageStore("tenant store over memory", () => createTenantStore(createMemoryStore(), "acme"));
// The in-memory queue the host's tests rely on behaves like a real one.
describeQueueAdapter("memory queue", () => createMemoryQueue(), {
  consume: (queue) => queue.results.map((body) => ({ body, messageId: body.requestId })),
});

describe("launchJob", () => {
  it("renders user data the runner can authenticate with, and only launched jobs may stream", async () => {
    const queue = createMemoryQueue();
    const runner = createRunnerService(queue, { secret: "host-secret", requireKnownJobs: true });
    const transport = createRouterTransport(({ service }) => service(Runner, runner));
    const client = createClient(Runner, transport);

    const { requestId, userData } = await launchJob(runner, "host-secret", "https://ci.internal:50051", {
      repoUrl: "https://example.org/app.git",
      commitSha: "abc123",
      command: ["make", "test"],
    });
    const config = JSON.parse(
      (parseYaml(userData) as { write_files: Array<{ content: string }> }).write_files[0]!.content,
    ) as {
      requestId: string;
      token: string;
      command: string;
      args: string[];
    };
    expect(config).toMatchObject({ requestId, command: "make", args: ["test"] });

    async function* items(id: string): AsyncIterable<LogItem> {
      yield create(LogItemSchema, { requestId: id, event: { case: "log", value: { line: "ok", stderr: false } } });
      yield create(LogItemSchema, {
        requestId: id,
        event: { case: "end", value: { exitCode: 0, success: true, repoUrl: "", commitSha: "" } },
      });
    }
    const ack = await client.streamLogs(items(requestId), { headers: { authorization: `Bearer ${config.token}` } });
    expect(ack.ok).toBe(true);
    expect(await queue.next()).toMatchObject({
      requestId,
      outcome: "finished",
      exitCode: 0,
      lines: { stdout: 1, stderr: 0 },
    });

    // A job the host never launched is refused, even with a valid token for it.
    const stranger = "00000000-0000-4000-8000-000000000000";
    const refused = await client
      .streamLogs(items(stranger), { headers: { authorization: `Bearer ${mintJobToken("host-secret", stranger)}` } })
      .catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(ConnectError);
    expect((refused as ConnectError).code).toBe(Code.NotFound);
    expect(queue.results).toHaveLength(1);
    await runner.close();
  });
});

describe("two tenants on one backing store", () => {
  it("each depot sees only its own packages", async () => {
    const backing = createMemoryStore();
    const acme = createPackageRouter(createTenantStore(backing, "acme"));
    const globex = createPackageRouter(createTenantStore(backing, "globex"));
    const call = (depot: typeof acme, method: string, path: string, init: RequestInit = {}) =>
      depot.fetch(new Request(`http://depot.test${path}`, { method, ...init }));

    const opened = await (await call(acme, "POST", "/trans/tool@1.0.0")).json();
    const added = await call(acme, "POST", `/add/${opened.transaction}/file`, {
      headers: { "Pkg-Path": "bin/tool" },
      body: "#!/bin/sh\n",
    });
    expect(added.status).toBe(201);
    expect((await call(acme, "POST", `/commit/${opened.transaction}`)).status).toBe(201);

    expect((await (await call(acme, "GET", "/catalog")).json()).count).toBe(1);
    expect((await (await call(globex, "GET", "/catalog")).json()).count).toBe(0);
    const missing = await call(globex, "GET", "/data/tool");
    expect([missing.status, (await missing.json()).code]).toEqual([404, "PACKAGE_NOT_FOUND"]);
  });
});
