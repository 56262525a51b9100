/**
 * A job publishes with its own credentials and the orchestrator attests its provenance
 * (issue 26): a real runner service (gRPC over HTTP/2, fs log store) takes the job's log,
 * and a real depot (fs store, listening) authorises the job's token for the packages the
 * orchestrator allowed, and at commit attaches a SLSA provenance signed with the
 * orchestrator's key naming the builder, the repository and commit it registered, the
 * request ID and the digest of the stored log.
 */
import { createHash, randomUUID } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { jobCredentials, jobProvenance } from "../../../src/cli/runner/job-publishing.js";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import { bearerTokens } from "../../../src/depot/server/auth.js";
import { createPackageRouter } from "../../../src/depot/server/router.js";
import { servePackageRouter, type PackageServer } from "../../../src/depot/server/serve.js";
import { generateSigningKey, signingKeyFromPem, trustedKeyEntry } from "../../../src/depot/signing/keys.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { mintJobToken } from "../../../src/runner/protocol/token.js";
import { end, line, send, startHarness, type Harness } from "../../fixtures/runner-service.js";
import { failure } from "../../fixtures/errors.js";

const SECRET = "job-secret-for-tests";
const BUILDER = "https://ci.example.test/runner-depot/orchestrator";
const orchestrator = generateSigningKey();
const admin = "admin-token";
let runner: Harness;
let dir: string;
let store: PackageStore;
let depot: PackageServer;

beforeAll(async () => {
  runner = await startHarness({ secret: SECRET });
  dir = await mkdtemp(path.join(os.tmpdir(), "job-publishing-"));
  store = createFsStore(dir, { unsafeNoSync: true });
  const router = createPackageRouter(store, {
    authorize: jobCredentials({
      logs: runner.logs,
      secret: SECRET,
      fallback: bearerTokens({ [admin]: ["*"] }, { publicRead: true }),
    }),
    provenance: {
      key: signingKeyFromPem(orchestrator.privateKey),
      builderId: BUILDER,
      jobOf: jobProvenance(runner.logs, (id) => `https://ci.example.test/jobs/${id}`),
    },
  });
  depot = await servePackageRouter(router, { host: "127.0.0.1", port: 0 });
});
afterAll(async () => {
  await depot?.close();
  await store?.close?.();
  await runner?.close();
  await rm(dir, { recursive: true, force: true });
});

/** A job the orchestrator launched for a repository and commit, allowed to publish `publish`, with some log. */
async function launch(publish: string[]): Promise<{ requestId: string; token: string }> {
  const requestId = randomUUID();
  await runner.runner.expectJob(requestId, {
    repoUrl: "https://git.example.test/team/tool.git",
    commitSha: "0123456789abcdef0123456789abcdef01234567",
    publish,
  });
  const token = mintJobToken(SECRET, requestId);
  const sent = await send(runner.client, [line(requestId, "building"), line(requestId, "warning: x", true)], {
    token,
  });
  expect(sent.ok).toBe(true);
  return { requestId, token };
}

const files = [{ type: "file" as const, path: "bin/tool", content: "#!/bin/sh\necho built\n" }];
const trust = { keys: [trustedKeyEntry(orchestrator, "orchestrator")] };

describe("a job publishes with its own credentials; the orchestrator attests provenance", () => {
  it("attaches a SLSA provenance naming builder, repository, commit, request ID and the log's digest", async () => {
    const job = await launch(["tool"]);
    const client = createDepotClient({ baseUrl: depot.url, token: `job.${job.requestId}.${job.token}` });
    await client.publish({ name: "tool", version: "1.0.0", items: files });

    const held = await client.verify("tool@1.0.0", { policy: "require", trustedKeys: trust, builders: [BUILDER] });
    expect(held).toEqual([
      expect.objectContaining({
        keyId: orchestrator.keyId,
        keyName: "orchestrator",
        predicateType: "https://slsa.dev/provenance/v1",
        builderId: BUILDER,
        requestId: job.requestId,
      }),
    ]);
    const [attestation] = (await client.attestations("tool@1.0.0")).attestations;
    const bundle = attestation!.bundle as { dsseEnvelope: { payload: string } };
    const statement = JSON.parse(Buffer.from(bundle.dsseEnvelope.payload, "base64").toString("utf8"));
    expect(statement.predicate.buildDefinition.externalParameters).toEqual({
      repository: "https://git.example.test/team/tool.git",
      commit: "0123456789abcdef0123456789abcdef01234567",
    });
    // The log's digest is over what the runner stored, as the control API renders it.
    const stored = await runner.logs.read(job.requestId);
    const digest = createHash("sha256")
      .update(stored.map((l) => `${JSON.stringify(l)}\n`).join(""))
      .digest("hex");
    expect(statement.predicate.runDetails.byproducts).toEqual([
      {
        name: "log",
        digest: { sha256: digest },
        uri: `https://ci.example.test/jobs/${job.requestId}`,
        annotations: { lines: 2 },
      },
    ]);
  });

  it("refuses a job publishing a package it was not allowed, and after it ended", async () => {
    const job = await launch(["tool"]);
    const client = createDepotClient({ baseUrl: depot.url, token: `job.${job.requestId}.${job.token}` });
    const other = await failure(client.publish({ name: "other", version: "1.0.0", items: files }));
    expect(other).toMatchObject({ code: "PERMISSION_DENIED" });
    expect((await send(runner.client, [end(job.requestId)], { token: job.token, offset: 2 })).ok).toBe(true);
    const ended = await failure(client.publish({ name: "tool", version: "2.0.0", items: files }));
    expect(ended).toMatchObject({ code: "PERMISSION_DENIED" });
    expect(ended.message).toContain("is not running");
    const forged = createDepotClient({ baseUrl: depot.url, token: `job.${job.requestId}.${"A".repeat(43)}` });
    expect(await failure(forged.publish({ name: "tool", version: "2.0.1", items: files }))).toMatchObject({
      code: "UNAUTHENTICATED",
    });
  });

  it("an installer requiring the builder refuses a version the admin token published", async () => {
    const client = createDepotClient({ baseUrl: depot.url, token: admin });
    await client.publish({ name: "tool", version: "3.0.0", items: files });
    const target = await mkdtemp(path.join(dir, "install-"));
    const refused = await failure(
      client.install("tool@3.0.0", target, {
        signatures: { policy: "verify", trustedKeys: trust, builders: [BUILDER] },
      }),
    );
    expect(refused).toMatchObject({ code: "BUILDER_UNTRUSTED", details: { package: "tool", version: "3.0.0" } });
    // The job-built version installs under the same policy.
    const ok = await client.install("tool@1.0.0", target, {
      signatures: { policy: "require", trustedKeys: trust, builders: [BUILDER] },
    });
    expect(ok.packages[0]!.verified).toEqual([
      expect.objectContaining({ builderId: BUILDER, predicateType: "https://slsa.dev/provenance/v1" }),
    ]);
  });
});
