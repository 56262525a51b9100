/**
 * A job's own depot credentials under attack (review of issue 26): a real runner service
 * (gRPC over HTTP/2) holds the jobs, a real depot (fs store, listening) authorises them.
 * The hole: a job allowed `*` published the single-file agent's package name, and the next
 * `serve` (publishAgent) took the version it found as its own, so every VM fetched and ran
 * the job's file as root. What held: patterns read `.` literally, another job's token,
 * another job's transaction.
 */
import { createHash, randomUUID } from "node:crypto";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { jobCredentials } from "../../../src/cli/runner/job-publishing.js";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import { bearerTokens } from "../../../src/depot/server/auth.js";
import { createPackageRouter } from "../../../src/depot/server/router.js";
import { servePackageRouter, type PackageServer } from "../../../src/depot/server/serve.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { publishAgent } from "../../../src/runner/agent/agent-package.js";
import { mintJobToken } from "../../../src/runner/protocol/token.js";
import { line, send, startHarness, type Harness } from "../../fixtures/runner-service.js";
import { failure } from "../../fixtures/errors.js";

const SECRET = "job-secret-for-attack-tests";
const admin = "admin-token";
let runner: Harness;
let dir: string;
let store: PackageStore;
let depot: PackageServer;

beforeAll(async () => {
  runner = await startHarness({ secret: SECRET });
  dir = await mkdtemp(path.join(os.tmpdir(), "job-publishing-attacks-"));
  store = createFsStore(path.join(dir, "store"), { unsafeNoSync: true });
  const router = createPackageRouter(store, {
    authorize: jobCredentials({
      logs: runner.logs,
      secret: SECRET,
      fallback: bearerTokens({ [admin]: ["*"] }, { publicRead: true }),
    }),
  });
  depot = await servePackageRouter(router, { host: "127.0.0.1", port: 0 });
});
afterAll(async () => {
  await depot?.close();
  await store?.close?.();
  await runner?.close();
  await rm(dir, { recursive: true, force: true });
});

/** A running job allowed `publish`, and its depot credentials. */
async function launch(publish: string[]): Promise<{ requestId: string; token: string; credential: string }> {
  const requestId = randomUUID();
  await runner.runner.expectJob(requestId, {
    repoUrl: "https://git.example.test/a.git",
    commitSha: "0".repeat(40),
    publish,
  });
  const token = mintJobToken(SECRET, requestId);
  expect((await send(runner.client, [line(requestId, "building")], { token })).ok).toBe(true);
  return { requestId, token, credential: `job.${requestId}.${token}` };
}

const files = (text: string) => [{ type: "file" as const, path: "bin/tool", content: text }];

describe("a job's depot credentials", () => {
  it("never publish the agent's package, even with `*`; serve refuses an agent version it did not build", async () => {
    const job = await launch(["*"]);
    const client = createDepotClient({ baseUrl: depot.url, token: job.credential });
    await client.publish({ name: "anything", version: "1.0.0", items: files("ok") });
    const evil = "#!/bin/sh\necho owned\n";
    const refused = await failure(
      client.publish({
        name: "runner-depot-agent-linux-x64",
        version: "9.9.9",
        items: [{ type: "file", path: "runner-depot-agent", mode: 0o755, content: evil }],
      }),
    );
    expect(refused).toMatchObject({ code: "PERMISSION_DENIED" });

    // Whoever else got the name first (here a packager with the admin token): publishAgent
    // does not hand VMs that version's digest as the agent it built.
    const adminClient = createDepotClient({ baseUrl: depot.url, token: admin });
    await adminClient.publish({
      name: "runner-depot-agent-linux-x64",
      version: "9.9.9",
      items: [{ type: "file", path: "runner-depot-agent", mode: 0o755, content: evil }],
    });
    const built = path.join(dir, "built");
    await mkdir(built);
    const agent = "#!/bin/sh\necho the real agent\n";
    await writeFile(path.join(built, "runner-depot-agent-linux-x64"), agent, { mode: 0o755 });
    const sha256 = createHash("sha256").update(agent).digest("hex");
    await writeFile(
      path.join(built, "agents.json"),
      JSON.stringify({
        version: "9.9.9",
        node: "22",
        agents: [{ platform: "linux-x64", file: "runner-depot-agent-linux-x64", size: agent.length, sha256 }],
      }),
    );
    const conflict = await failure(publishAgent({ client: adminClient, dir: built }));
    expect(conflict).toMatchObject({ code: "CONFLICT" });
    expect(conflict.message).toContain(`expected sha256:${sha256}`);
  });

  it("read `.` in a pattern literally and `?` as one character", async () => {
    const job = await launch(["tool.x", "lib-?"]);
    const client = createDepotClient({ baseUrl: depot.url, token: job.credential });
    for (const name of ["toolax", "lib-ab", "lib-"])
      expect(await failure(client.publish({ name, version: "1.0.0", items: files(name) }))).toMatchObject({
        code: "PERMISSION_DENIED",
      });
    await client.publish({ name: "tool.x", version: "1.0.0", items: files("a") });
    await client.publish({ name: "lib-a", version: "1.0.0", items: files("b") });
  });

  it("are refused with another job's token, and never touch another job's transaction", async () => {
    const a = await launch(["shared-*"]);
    const b = await launch(["shared-*"]);
    const crossed = createDepotClient({ baseUrl: depot.url, token: `job.${a.requestId}.${b.token}` });
    expect(await failure(crossed.publish({ name: "shared-x", version: "1.0.0", items: files("x") }))).toMatchObject({
      code: "UNAUTHENTICATED",
    });
    const opened = await fetch(`${depot.url}/trans/shared-y@1.0.0`, {
      method: "POST",
      headers: { authorization: `Bearer ${a.credential}` },
    });
    expect(opened.status).toBe(201);
    const { transaction } = (await opened.json()) as { transaction: string };
    for (const [method, route] of [
      ["POST", `/commit/${transaction}`],
      ["DELETE", `/trans/${transaction}`],
    ] as const) {
      const answer = await fetch(`${depot.url}${route}`, {
        method,
        headers: { authorization: `Bearer ${b.credential}` },
      });
      expect([403, 404]).toContain(answer.status);
    }
    // Still a's, and open: a commits it.
    const committed = await fetch(`${depot.url}/commit/${transaction}`, {
      method: "POST",
      headers: { authorization: `Bearer ${a.credential}` },
    });
    expect(committed.status).toBeLessThan(300);
  });
});
