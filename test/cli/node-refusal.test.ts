/**
 * An unsupported Node is refused at startup (issue 29 item 1): the command built as
 * `dist/cli.js` is, run on a Node that reports 20.19.5, prints one message naming the
 * version needed and how to get it and exits 1 before `serve` writes anything; a library
 * entry point throws the same at import. (The Node version is faked by a preload, so this
 * runs on any supported Node; .ci/run repeats both on a real Node 20.)
 */
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bundleCli } from "../fixtures/cli-bundle.js";
import { MIN_NODE, unsupportedNode } from "../../src/node-support.js";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
let cli: Awaited<ReturnType<typeof bundleCli>>;
let dir: string;
let preload: string;

beforeAll(async () => {
  cli = await bundleCli();
  dir = await mkdtemp(path.join(os.tmpdir(), "node-refusal-"));
  preload = path.join(dir, "node20.mjs");
  // What an old Node reports; everything else about the process stays real.
  await writeFile(preload, "Object.defineProperty(process.versions, 'node', { value: '20.19.5' });\n");
}, 120_000);
afterAll(async () => {
  await cli?.remove();
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe("an unsupported Node", () => {
  it("is named, with the version needed, for every release below 22.15; 22.15 and later pass", () => {
    const [minMajor, minMinor] = MIN_NODE;
    fc.assert(
      fc.property(fc.nat(40), fc.nat(40), fc.nat(40), fc.boolean(), (major, minor, patch, v) => {
        const version = `${v ? "v" : ""}${major}.${minor}.${patch}`;
        const why = unsupportedNode(version);
        const old = major < minMajor || (major === minMajor && minor < minMinor);
        if (!old) return why === undefined;
        return why !== undefined && why.includes("22.15") && why.includes(`Node.js ${major}.${minor}.${patch}`);
      }),
    );
    expect(unsupportedNode("20.19.5")).toMatch(/nodejs\.org\/en\/download.*nvm install 22/);
  });

  it("stops `runner-depot serve` with one line and exit 1 before it writes its data folder", () => {
    const data = path.join(dir, "data");
    const run = spawnSync(
      process.execPath,
      ["--import", pathToFileURL(preload).href, cli.file, "serve", "--data", data],
      {
        encoding: "utf8",
        timeout: 60_000,
      },
    );
    expect(run.status).toBe(1);
    expect(run.stdout).toBe("");
    expect(run.stderr.trim().split("\n")).toEqual([unsupportedNode("20.19.5")]);
    expect(existsSync(data)).toBe(false);
  });

  it("makes a library entry point throw at import with its code", () => {
    const entry = pathToFileURL(path.join(root, "src", "depot", "index.ts")).href;
    const probe = `try { await import(${JSON.stringify(entry)}); console.log("loaded"); } catch (e) { console.log(JSON.stringify({ code: e.code, message: e.message })); }`;
    const run = spawnSync(
      process.execPath,
      ["--import", pathToFileURL(preload).href, "--import", "tsx", "--input-type=module", "-e", probe],
      { cwd: root, encoding: "utf8", timeout: 60_000 },
    );
    const thrown = JSON.parse(run.stdout.trim()) as { code: string; message: string };
    expect(thrown).toEqual({ code: "ERR_RUNNER_DEPOT_UNSUPPORTED_NODE", message: unsupportedNode("20.19.5") });
  });
});
