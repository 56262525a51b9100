/**
 * The fetch script's messages name the agent URL as given: `echo` in dash (the VM's
 * /bin/sh) reads backslash escapes, so a `\c` in the URL's query cut the REFUSED line short
 * and a `\n` in it forged a line of its own. The rendered runcmd runs against a real HTTP
 * server answering bytes whose SHA-256 is not the one given.
 */
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { mkdir, symlink } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parse } from "yaml";
import { renderCloudInit } from "../../../src/runner/agent/cloud-init.js";
import { tempDir } from "../../fixtures/depot.js";

const run = promisify(execFile);
const BODY = "not the agent";
let server: http.Server;
let base = "";
let work: { dir: string; cleanup: () => Promise<void> };

beforeAll(async () => {
  work = await tempDir("fetch-agent-messages-");
  server = http.createServer((_request, response) => response.end(BODY));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  await new Promise((resolve) => server?.close(resolve));
  await work?.cleanup();
});

describe("the agent fetch's messages", () => {
  it("print a URL holding backslashes as it is, on one line", async () => {
    const bin = path.join(work.dir, "bin");
    await mkdir(bin);
    for (const tool of ["sh", "mkdir", "chmod", "rm", "cut", "sleep", "tar", "curl", "sha256sum"]) {
      const { stdout } = await run("sh", ["-c", `PATH=/usr/bin:/bin; command -v ${tool}`]);
      await symlink(stdout.trim(), path.join(bin, tool));
    }
    const url = `${base}/agent?x=a\\cb\\nrunner-depot: forged`;
    const text = renderCloudInit({
      endpoint: "http://10.0.2.100:1",
      requestId: "0b5f0c8e-7d3a-4c1e-9f2a-1b2c3d4e5f60",
      token: "t",
      command: ["make"],
      agent: { url, sha256: "0".repeat(64) },
      onWarning: () => undefined,
    });
    const argv = (parse(text) as { runcmd: string[][] }).runcmd[0]!;
    const dir = path.join(work.dir, "agent");
    const result = await run(argv[0]!, [...argv.slice(1, -1), dir], { env: { PATH: bin } }).then(
      () => ({ code: 0, stderr: "" }),
      (e: { code: number; stderr: string }) => e,
    );
    expect(result.code).toBe(1);
    const href = new URL(url).href;
    expect(result.stderr).toBe(
      `runner-depot: REFUSED the agent from ${href}: its SHA-256 is ${createHash("sha256").update(BODY).digest("hex")}, expected ${"0".repeat(64)}; nothing was run\n`,
    );
  });
});
