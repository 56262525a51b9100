/**
 * `runner-depot retention` against a real `serve` process: the dry run lists what would go and changes nothing;
 * the real run removes exactly those through the control API (admin token); usage errors exit 2.
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { publish } from "../../fixtures/depot.js";
import { stopChild } from "../../fixtures/stop-child.js";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const main = path.join(root, "src", "cli", "main.ts");
const tsx = pathToFileURL(path.join(root, "node_modules", "tsx", "dist", "loader.mjs")).href;

describe("runner-depot retention", () => {
  let work: string;
  let data: string;
  let serve: ChildProcess;
  let depotUrl = "";
  let adminToken = "";
  beforeAll(async () => {
    work = await mkdtemp(path.join(os.tmpdir(), "cli-retention-"));
    data = path.join(work, "data");
    serve = spawn(
      process.execPath,
      ["--import", tsx, main, "serve", "--runner-port", "0", "--depot-port", "0", "--data", data],
      {
        cwd: work,
        stdio: ["ignore", "pipe", "pipe"],
      },
    );
    let err = "";
    await new Promise<void>((resolve, reject) => {
      serve.stderr!.setEncoding("utf8").on("data", (d: string) => {
        err += d;
        if (err.includes("Ctrl-C stops")) resolve();
      });
      serve.once("exit", () => reject(new Error(`serve exited: ${err}`)));
    });
    ({ depotUrl, adminToken } = JSON.parse(await readFile(path.join(data, "serve.json"), "utf8")) as {
      depotUrl: string;
      adminToken: string;
    });
  });
  afterAll(async () => {
    await stopChild(serve);
    await rm(work, { recursive: true, force: true });
  });

  const cli = (...args: string[]) =>
    spawnSync(process.execPath, ["--import", tsx, main, "retention", "--data", data, ...args], {
      cwd: work,
      encoding: "utf8",
    });
  const versions = async () =>
    ((await (await fetch(`${depotUrl}/version/tool`)).json()) as { versions: Array<{ version: string }> }).versions.map(
      (v) => v.version,
    );

  it("a dry run lists, the real run removes exactly those; the feed says so", async () => {
    const auth = { Authorization: `Bearer ${adminToken}` };
    for (const v of ["1.0.0", "1.1.0", "1.2.0"])
      expect(
        (await publish(depotUrl, `tool@${v}`, [{ type: "file", path: "f", body: `tool ${v}` }], auth)).status,
      ).toBe(201);
    const dry = cli("--keep-last", "1", "--dry-run");
    expect(dry.status, dry.stderr).toBe(0);
    const listed = dry.stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { name: string; version: string; bytes: number });
    expect(listed.map((o) => `${o.name}@${o.version}`)).toEqual(["tool@1.0.0", "tool@1.1.0"]);
    expect(listed.every((o) => o.bytes > 0)).toBe(true);
    expect(dry.stderr).toContain("would remove 2 versions");
    expect(await versions()).toEqual(["1.0.0", "1.1.0", "1.2.0"]);

    const real = cli("--keep-last", "1");
    expect(real.status, real.stderr).toBe(0);
    expect(real.stdout).toBe(dry.stdout);
    expect(await versions()).toEqual(["1.2.0"]);
    const feed = (await (await fetch(`${depotUrl}/catalog?since=3`)).json()) as {
      changes: Array<{ version: string; removed?: boolean }>;
    };
    expect(feed.changes).toEqual([
      { position: 4, name: "tool", version: "1.0.0", removed: true },
      { position: 5, name: "tool", version: "1.1.0", removed: true },
    ]);
  });

  it("exits 2 without a rule or with a bad number, and the route refuses without the admin token", async () => {
    expect(cli().status).toBe(2);
    expect(cli("--keep-last", "x").status).toBe(2);
    const refused = await fetch(`${depotUrl}/-/retention`, { method: "POST", body: JSON.stringify({ keepLast: 1 }) });
    expect(refused.status).toBe(401);
    const bad = await fetch(`${depotUrl}/-/retention`, {
      method: "POST",
      headers: { Authorization: `Bearer ${adminToken}` },
      body: JSON.stringify({ keepLast: 0 }),
    });
    expect(bad.status).toBe(400);
  });
});
