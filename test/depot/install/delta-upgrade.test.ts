/**
 * Upgrades through deltas, against a real listening depot (fs store, real fetch).
 */
import { randomBytes } from "node:crypto";
import { chmod, mkdir, rm, symlink, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createDepotClient, type DepotClient } from "../../../src/depot/client/depot-client.js";
import type { InstallProgress } from "../../../src/depot/install/installer.js";
import { loggingFetch, snapshotTree, startDepot } from "../../fixtures/depot-client-harness.js";

type Depot = Awaited<ReturnType<typeof startDepot>>;
let depot: Depot;
let client: DepotClient;
let src: string;

beforeAll(async () => {
  depot = await startDepot();
  client = createDepotClient({ baseUrl: depot.url });
  // 100 files of 8–24 KiB of random bytes (about 1.6 MiB), in 10 directories, plus a link.
  src = await depot.tempDir("src");
  for (let d = 0; d < 10; d++) {
    await mkdir(path.join(src, `dir${d}`));
    for (let f = 0; f < 10; f++) {
      await writeFile(path.join(src, `dir${d}`, `file${f}.bin`), randomBytes(8192 + ((d * 10 + f) % 8) * 2048));
    }
  }
  await symlink("dir0/file0.bin", path.join(src, "current"));
  await client.publish({ name: "hundred", version: "1.0.0", dir: src });
  // 1.1.0: exactly one file changed.
  await writeFile(path.join(src, "dir4/file2.bin"), randomBytes(10_000));
  await client.publish({ name: "hundred", version: "1.1.0", dir: src });
  // 1.2.0: a file removed, a mode changed, a link retargeted, a file added.
  await rm(path.join(src, "dir9/file9.bin"));
  await chmod(path.join(src, "dir1/file1.bin"), 0o755);
  await rm(path.join(src, "current"));
  await symlink("dir4/file2.bin", path.join(src, "current"));
  await writeFile(path.join(src, "dir5/added.txt"), "added in 1.2.0");
  await client.publish({ name: "hundred", version: "1.2.0", dir: src });
});
afterAll(async () => {
  await depot?.close();
});

async function freshInstall(spec: string) {
  const dir = await depot.tempDir("fresh");
  await client.install(spec, dir);
  return snapshotTree(path.join(dir, "hundred"));
}

describe("delta upgrades", () => {
  it("upgrades a 100-file package through a delta of under 5% of the archive, equal to a fresh install", async () => {
    const target = await depot.tempDir("upgrade");
    await client.install("hundred@1.0.0", target);

    const { fetch, log } = loggingFetch();
    const watching = createDepotClient({ baseUrl: depot.url, fetch });
    const result = await watching.install("hundred@1.1.0", target);
    const action = result.packages[0]!;
    expect(action).toMatchObject({
      name: "hundred",
      version: "1.1.0",
      action: "upgraded",
      from: "1.0.0",
      via: "delta",
    });

    const whole = (await client.versions("hundred")).versions.find((v) => v.version === "1.1.0")!;
    expect(whole.size).toBeGreaterThan(1_000_000);
    expect(action.bytes).toBeLessThan(whole.size * 0.05);
    // The delta URL was fetched, and the only whole-archive request was the ranged manifest read.
    const data = log.filter((r) => r.url.includes("/data/"));
    expect(data.some((r) => r.url.endsWith("/data/hundred/1.0.0/1.1.0") && r.status === 200)).toBe(true);
    expect(data.filter((r) => /\/data\/hundred@/.test(r.url)).every((r) => r.status === 206 && r.headers.range)).toBe(
      true,
    );

    expect(await snapshotTree(path.join(target, "hundred"))).toEqual(await freshInstall("hundred@1.1.0"));
  });

  it("applies removals, mode changes and link changes, and can go down as well", async () => {
    const target = await depot.tempDir("upgrade2");
    await client.install("hundred@1.0.0", target);
    const up = await client.install("hundred@1.2.0", target);
    expect(up.packages[0]).toMatchObject({ action: "upgraded", via: "delta" });
    expect(await snapshotTree(path.join(target, "hundred"))).toEqual(await freshInstall("hundred@1.2.0"));

    const down = await client.install("hundred@1.0.0", target);
    expect(down.packages[0]).toMatchObject({ action: "downgraded", from: "1.2.0", via: "delta" });
    expect(await snapshotTree(path.join(target, "hundred"))).toEqual(await freshInstall("hundred@1.0.0"));
  });

  it("follows the redirect of /data/<name>/<from> to the newest version", async () => {
    const out = path.join(await depot.tempDir("dl"), "delta.tar");
    const { fetch, log } = loggingFetch();
    const result = await createDepotClient({ baseUrl: depot.url, fetch }).download("hundred", {
      from: "1.0.0",
      to: out,
    });
    expect(result.url).toMatch(/\/data\/hundred\/1\.0\.0\/1\.2\.0$/);
    expect(log[0]!.url).toMatch(/\/data\/hundred\/1\.0\.0$/);
  });

  it("falls back to the whole archive when the installed files were modified locally (the edit kept as .old)", async () => {
    const target = await depot.tempDir("tampered");
    await client.install("hundred@1.0.0", target);
    await writeFile(path.join(target, "hundred", "dir7/file7.bin"), "local edit");
    const events: InstallProgress[] = [];
    // The edit is the user's: kept as .old (by default the install would refuse; see depot-install-preserve).
    const result = await client.install("hundred@1.1.0", target, {
      onProgress: (e) => events.push(e),
      preserve: "renameold",
    });
    expect(result.packages[0]).toMatchObject({ action: "upgraded", via: "full", kept: ["hundred/dir7/file7.bin.old"] });
    const fallback = events.find((e) => e.phase === "fallback");
    expect(fallback && "reason" in fallback ? fallback.reason : "").toContain("dir7/file7.bin");
    expect(await snapshotTree(path.join(target, "hundred"), { skip: ["dir7/file7.bin.old"] })).toEqual(
      await freshInstall("hundred@1.1.0"),
    );
  });
});
