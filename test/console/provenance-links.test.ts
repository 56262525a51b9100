/**
 * The console links a package to the job that built it and the job to what it published
 * (issue 26), in a real browser (Debian's chromium via playwright-core): a real runner
 * server takes the job's log over gRPC, the job publishes through a real depot with its
 * own credentials, the depot attests its provenance, and the console is mounted as `serve`
 * mounts it. Without chromium the test is skipped with the reason.
 */
import { randomUUID } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import type { Browser } from "playwright-core";
import { toNodeHandler } from "srvx/node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMemoryQueue, createMemoryStore } from "../../src/adapters/memory/index.js";
import { jobCredentials, jobProvenance } from "../../src/cli/runner/job-publishing.js";
import { createConsole, createConsoleSessions, type ConsoleSessions } from "../../src/console/index.js";
import { bearerTokens } from "../../src/depot/server/auth.js";
import { createDepotClient, createPackageRouter } from "../../src/depot/index.js";
import { generateSigningKey, signingKeyFromPem } from "../../src/depot/signing/keys.js";
import { jobPublications } from "../../src/depot/store/attestations.js";
import { Runner } from "../../src/gen/runner/v1/runner_pb.js";
import {
  createRunnerService,
  startRunnerServer,
  type RunnerServer,
  type RunnerService,
} from "../../src/runner/index.js";
import { mintJobToken } from "../../src/runner/protocol/token.js";
import { chromiumMissing, closeConsoleStack, launchChromium } from "../fixtures/chromium.js";
import { line, send } from "../fixtures/runner-service.js";

const SECRET = "console-provenance-secret";
const BUILDER = "urn:runner-depot:orchestrator:test";

describe.skipIf(chromiumMissing !== null)("console: built by job, and what a job published", () => {
  let browser: Browser;
  let runner: RunnerService;
  let runnerServer: RunnerServer;
  let httpServer: http.Server;
  let sessions: ConsoleSessions;
  let origin: string;
  const requestId = randomUUID();

  beforeAll(async () => {
    runner = createRunnerService(createMemoryQueue(), { secret: SECRET });
    runnerServer = await startRunnerServer(runner, { host: "127.0.0.1", port: 0 });
    const depot = createPackageRouter(createMemoryStore(), {
      onError: () => undefined,
      authorize: jobCredentials({
        logs: runner.logs,
        secret: SECRET,
        fallback: bearerTokens({ admin: ["*"] }, { publicRead: true }),
      }),
      provenance: {
        key: signingKeyFromPem(generateSigningKey().privateKey),
        builderId: BUILDER,
        jobOf: jobProvenance(runner.logs),
      },
    });
    sessions = createConsoleSessions();
    const webConsole = createConsole({
      runner,
      depot,
      sessions,
      base: "/-/console",
      jobPublications: (id) => jobPublications(depot.store, id),
    });
    const handler = toNodeHandler((request: Request) =>
      new URL(request.url).pathname.startsWith("/-/console") ? webConsole.fetch(request) : depot.fetch(request),
    ) as unknown as http.RequestListener;
    httpServer = http.createServer(handler);
    await new Promise<void>((resolve) => httpServer.listen(0, "127.0.0.1", resolve));
    origin = `http://127.0.0.1:${(httpServer.address() as AddressInfo).port}`;

    // The job: launched for a repository, allowed to publish "tool", some log, then its publish.
    await runner.expectJob(requestId, {
      repoUrl: "https://git.example.test/tool.git",
      commitSha: "abc123",
      publish: ["tool"],
    });
    const token = mintJobToken(SECRET, requestId);
    const grpc = createClient(Runner, createGrpcTransport({ baseUrl: runnerServer.url }));
    expect((await send(grpc, [line(requestId, "make all")], { token })).ok).toBe(true);
    await createDepotClient({ baseUrl: origin, token: `job.${requestId}.${token}` }).publish({
      name: "tool",
      version: "1.0.0",
      items: [{ type: "file", path: "bin/tool", content: "#!/bin/sh\n" }],
    });
    browser = await launchChromium();
  }, 120_000);

  afterAll(async () => {
    await closeConsoleStack({ browser, httpServer, runnerServer, runner });
  });

  it("the package page says built by job <id>, linking to the job, whose page lists tool@1.0.0", async () => {
    const page = await (await browser.newContext()).newPage();
    await page.goto(`${origin}/-/console/?token=${sessions.loginToken()}`);
    await Promise.all([page.waitForNavigation(), page.getByRole("button", { name: "Sign in" }).click()]);
    await page.goto(`${origin}/-/console/packages/tool`);
    const builtBy = page.locator(".built-by");
    await builtBy.waitFor();
    expect(await builtBy.textContent()).toBe(`built by job ${requestId} (signed by ${BUILDER})`);
    await builtBy.getByRole("link", { name: `job ${requestId}` }).click();
    await page.waitForURL(`${origin}/-/console/jobs/${requestId}`);
    const published = page.locator("#published a");
    await published.first().waitFor();
    expect(await published.allTextContents()).toEqual(["tool@1.0.0"]);
    await published.first().click();
    await page.waitForURL(`${origin}/-/console/packages/tool?version=1.0.0`);
    await page.locator(".built-by").waitFor();
  });
});
