/**
 * `runner-depot install` against a hostile depot whose answers begin and then drip or go
 * silent (issue 30, item 6): $RUNNER_DEPOT_TIMEOUT bounds the bodies too, not only the wait
 * for headers, so the command ends within a few times the timeout rather than hanging.
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
