/**
 * `npm run bench` never changes the machine unless asked: a missing peer program is
 * reported (with the command that installs it) and apt-get is not run; with
 * --install-peers apt-get is run for it. apt-get here is a stand-in first on PATH that
 * records its arguments, so nothing is installed by this test.
 */
import { chmod, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { peerMissing, type SystemPeer } from "../../bench/peers.js";

let dir: string;
let calls: string;
const savedPath = process.env.PATH;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "bench-peers-"));
  calls = join(dir, "apt-get.calls");
  const fake = join(dir, "apt-get");
  await writeFile(fake, `#!/bin/sh\necho "$DEBIAN_FRONTEND $*" >> "${calls}"\n`);
  await chmod(fake, 0o755);
  process.env.PATH = `${dir}:${savedPath}`;
});
afterAll(async () => {
  process.env.PATH = savedPath;
  await rm(dir, { recursive: true, force: true });
});

const aptCalls = () =>
  readFile(calls, "utf8").then(
    (text) => text.trim().split("\n"),
    () => [],
  );

describe("bench peers", () => {
  it("a peer that is there is used as it is", async () => {
    expect(await peerMissing({ name: "sh", bin: "/bin/sh", aptPackage: "dash", module: "x" }, false)).toBeNull();
    expect(await aptCalls()).toEqual([]);
  });

  it("without --install-peers a missing peer is named with how to get it, and apt-get is never run", async () => {
    const peer: SystemPeer = { name: "nginx", bin: join(dir, "no", "nginx"), aptPackage: "nginx", module: "depot" };
    expect(await peerMissing(peer, false)).toBe(
      "nginx is not installed (`apt-get install nginx`, or `npm run bench -- depot --install-peers` to let the bench install it)",
    );
    expect(await aptCalls()).toEqual([]);
  });

  it("with --install-peers apt-get installs it, and a package that does not provide the program is reported", async () => {
    const peer: SystemPeer = { name: "nginx", bin: join(dir, "no", "nginx"), aptPackage: "nginx", module: "depot" };
    expect(await peerMissing(peer, true)).toBe(`apt-get install nginx did not provide ${peer.bin}`);
    expect(await aptCalls()).toEqual([
      "noninteractive update",
      "noninteractive install -y --no-install-recommends nginx",
    ]);
  });
});

describe("bench modules", () => {
  it("run apt-get only through peerMissing (so only with --install-peers)", async () => {
    const { readdir } = await import("node:fs/promises");
    const benchDir = new URL("../../bench/", import.meta.url);
    const offenders: string[] = [];
    for (const file of await readdir(benchDir)) {
      if (!file.endsWith(".ts") || file === "peers.ts") continue;
      if (/apt-get["'`]?\s*,|["'`]apt-get["'`]|apt_install/.test(await readFile(new URL(file, benchDir), "utf8")))
        offenders.push(file);
    }
    expect(offenders).toEqual([]);
  });
});
