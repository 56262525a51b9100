/**
 * `runner-depot install` against a hostile depot whose answers begin and then drip or go
 * silent (issue 30, item 6): $RUNNER_DEPOT_TIMEOUT bounds the bodies too, not only the wait
 * for headers, so the command ends within a few times the timeout rather than hanging.
 * And against a depot whose one package requires 300 others: the resolver's limits, which
 * bound what such answers cost, are the command's flags, and a give-up names the flag.
 */
import { spawn } from "node:child_process";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bundleCli } from "../../fixtures/cli-bundle.js";
import { tempDir } from "../../fixtures/depot.js";

let cli: Awaited<ReturnType<typeof bundleCli>>;
let tmp: Awaited<ReturnType<typeof tempDir>>;
let server: Server;
let url: string;

beforeAll(async () => {
  cli = await bundleCli();
  tmp = await tempDir("depot-body-timeout-");
  server = createServer((req, res) => {
    if (req.url === "/version/drip") {
      // A byte a second, for a minute: never idle for a whole second, never done either.
      res.writeHead(200, { "content-type": "application/json" });
      const timer = setInterval(() => res.write(" "), 200);
      setTimeout(() => (clearInterval(timer), res.end()), 60_000);
      res.on("close", () => clearInterval(timer));
      return;
    }
    if (req.url === "/version/wide" || req.url === "/depend/wide@1.0.0") {
      res.writeHead(200, { "content-type": "application/json" });
      const requires = Array.from({ length: 300 }, (_, i) => ({ name: `dep${i}`, range: "*" }));
      const digest = `sha256:${"0".repeat(64)}`;
      const body = req.url.startsWith("/version/")
        ? { name: "wide", latest: "1.0.0", versions: [{ version: "1.0.0", digest, size: 1 }] }
        : { name: "wide", version: "1.0.0", requires };
      return res.end(JSON.stringify(body));
    }
    if (req.url?.startsWith("/version/dep")) {
      res.writeHead(404, { "content-type": "application/problem+json" });
      return res.end(JSON.stringify({ code: "NOT_FOUND", status: 404, detail: req.url }));
    }
    // /version/silent: headers, then nothing.
    res.writeHead(200, { "content-type": "application/json" });
    res.write("{");
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}, 120_000);

afterAll(async () => {
  server.closeAllConnections();
  await new Promise((r) => server.close(r));
  await cli.remove();
  await tmp.cleanup();
});

/** Runs the command; its exit code and stderr. */
function run(args: string[], env: Record<string, string>): Promise<{ code: number | null; err: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [cli.file, ...args], {
      cwd: tmp.dir,
      env: { ...process.env, ...env, NO_COLOR: "1" },
      stdio: ["ignore", "ignore", "pipe"],
    });
    let err = "";
    child.stderr.on("data", (d: Buffer) => (err += d.toString()));
    child.on("exit", (code) => resolve({ code, err }));
  });
}

describe("runner-depot install: $RUNNER_DEPOT_TIMEOUT covers the body", () => {
  it("a /version dripping a byte every 200 ms fails at the timeout (1 s) as a whole", async () => {
    const got = await run(["install", "drip", path.join(tmp.dir, "a"), "--url", url], { RUNNER_DEPOT_TIMEOUT: "1" });
    expect(got.code).toBe(1);
    expect(got.err.trim()).toBe("runner-depot: install failed: GET /version/drip: the answer took longer than 1 s");
  });

  it("a /version that goes silent after its headers fails at the timeout between chunks", async () => {
    const got = await run(["install", "silent", path.join(tmp.dir, "b"), "--url", url], {
      RUNNER_DEPOT_TIMEOUT: "1",
    });
    expect(got.code).toBe(1);
    // Both bounds are the timeout here: whichever comes first names itself.
    expect(got.err.trim()).toMatch(
      /^runner-depot: install failed: GET \/version\/silent: (no byte of the answer for|the answer took longer than) 1 s$/,
    );
  });
});

describe("runner-depot install: the resolver's limits", () => {
  it("gives up at --max-requirements, naming the flag that raises it; above it resolves on", async () => {
    const low = await run(["install", "wide", path.join(tmp.dir, "c"), "--url", url, "--max-requirements", "100"], {});
    expect(low.code).toBe(1);
    expect(low.err.trim()).toBe(
      "runner-depot: install failed: gave up resolving wide after examining 100 requirements (raise it with --max-requirements)",
    );
    // Raised, the same graph gets as far as its first missing package.
    const high = await run(
      ["install", "wide", path.join(tmp.dir, "d"), "--url", url, "--max-requirements", "1000"],
      {},
    );
    expect(high.code).toBe(1);
    expect(high.err.trim()).toBe(
      "runner-depot: install failed: package dep0 is not in the depot (required as * by wide@1.0.0)",
    );
  });

  it("refuses a limit that is not a positive whole number as a usage error", async () => {
    for (const [flag, value] of [
      ["--max-versions-tried", "0"],
      ["--max-requirements", "1e3"],
      ["--max-versions-tried", "ten"],
    ] as const) {
      const got = await run(["install", "wide", path.join(tmp.dir, "e"), "--url", url, flag, value], {});
      expect(got.code, `${flag} ${value}`).toBe(2);
      expect(got.err).toContain(`${flag} takes a positive whole number, got '${value}'`);
    }
  });
});
