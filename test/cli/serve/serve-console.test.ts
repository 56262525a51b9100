/**
 * `runner-depot serve` mounts the console at /-/console/ on the depot's port and prints a
 * one-time login URL (spent by the "Sign in" POST, not by a GET), and `console-url` mints
 * another without a restart: a real serve process, real fetch.
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { consoleLogin } from "../../fixtures/console-login.js";
import { commandName } from "../../../src/cli/args.js";
import { stopChild } from "../../fixtures/stop-child.js";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const main = path.join(root, "src", "cli", "main.ts");
const tsx = pathToFileURL(path.join(root, "node_modules", "tsx", "dist", "loader.mjs")).href;

describe("serve: the console at /-/console/", () => {
  let work: string;
  let serve: ChildProcess;
  let loginUrl: string;
  let banner = "";
  beforeAll(async () => {
    work = await mkdtemp(path.join(os.tmpdir(), "console-serve-"));
    serve = spawn(
      process.execPath,
      ["--import", tsx, main, "serve", "--runner-port", "0", "--depot-port", "0", "--data", path.join(work, "data")],
      {
        cwd: work,
        stdio: ["ignore", "pipe", "pipe"],
      },
    );
    let err = "";
    loginUrl = await new Promise<string>((resolve, reject) => {
      serve.stderr!.setEncoding("utf8").on("data", (d: string) => {
        err += d;
        const match = /console:\s+(http:\/\/127\.0\.0\.1:\d+\/-\/console\/\?token=[A-Za-z0-9_-]+)/.exec(err);
        banner = err;
        if (match && err.includes("Ctrl-C stops")) resolve(match[1]!);
      });
      serve.once("exit", () => reject(new Error(`serve exited: ${err}`)));
    });
  });
  afterAll(async () => {
    await stopChild(serve);
    await rm(work, { recursive: true, force: true });
  });

  it("the printed login URL works once and opens the console's pages and API; the depot and control API stay where they were", async () => {
    const origin = new URL(loginUrl).origin;
    expect((await fetch(`${origin}/-/console/api/jobs`)).status).toBe(401);
    const login = await consoleLogin(loginUrl);
    expect(login.status).toBe(303);
    expect(login.headers.get("location")).toBe("/-/console/");
    expect(login.headers.get("set-cookie")).toMatch(/HttpOnly; SameSite=Strict/);
    const cookie = login.headers.get("set-cookie")!.split(";")[0]!;
    expect((await consoleLogin(loginUrl)).status).toBe(401);
    const jobs = await fetch(`${origin}/-/console/api/jobs`, { headers: { cookie } });
    expect(jobs.status).toBe(200);
    expect(await jobs.json()).toEqual({ jobs: [], next: null });
    const page = await fetch(`${origin}/-/console/packages/anything`, { headers: { cookie } });
    expect(page.status).toBe(200);
    expect(await page.text()).toContain('data-page="package"');
    expect((await fetch(`${origin}/catalog`)).status).toBe(200);
    expect((await fetch(`${origin}/-/jobs`, { method: "POST" })).status).toBe(401);
  });

  it("the banner names the commands as they run here: from a clone, through tsx (installed: runner-depot)", () => {
    expect(banner).toContain("Next: 'npx tsx src/cli/main.ts job --run -- <command>' runs a job here");
    expect(banner).toContain("'npx tsx src/cli/main.ts console-url' mints another");
    expect(commandName("/app/node_modules/runner-depot/dist/cli.js")).toBe("runner-depot");
    expect(commandName("/usr/local/bin/runner-depot")).toBe("runner-depot");
    expect(commandName(path.join(root, "src", "cli", "main.ts"))).toBe("npx tsx src/cli/main.ts");
  });

  it("console-url mints a new login URL without a restart; a link preview's GET leaves it usable", async () => {
    const minted = spawnSync(
      process.execPath,
      ["--import", tsx, main, "console-url", "--data", path.join(work, "data")],
      {
        cwd: work,
        encoding: "utf8",
        timeout: 60_000,
      },
    );
    expect(minted.status, minted.stderr).toBe(0);
    const url = minted.stdout.trim();
    expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/-\/console\/\?token=[A-Za-z0-9_-]{43}$/);
    expect(url).not.toBe(loginUrl);
    // An unfurler fetches the URL first: the page, no cookie, nothing spent.
    const preview = await fetch(url, { headers: { "user-agent": "Slackbot-LinkExpanding 1.0" } });
    expect(preview.status).toBe(200);
    expect(preview.headers.get("set-cookie")).toBeNull();
    const login = await consoleLogin(url);
    expect(login.status).toBe(303);
    expect(login.headers.get("set-cookie")).toMatch(/^runner_depot_console=/);
    // Without the admin token the control API mints nothing.
    expect((await fetch(`${new URL(url).origin}/-/console-url`, { method: "POST" })).status).toBe(401);
  });
});
