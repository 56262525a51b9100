/**
 * `runner-depot mirror` as a process against an upstream depot in another process: SIGKILLed after
 * its first copied version, run again, it finishes the copy with every version once; a second run
 * copies nothing; usage errors exit 2.
 */
import { spawn } from "node:child_process";
import { writeFile } from "node:fs/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { bundleCli } from "../../fixtures/cli-bundle.js";
import { bundleDepotServer, spawnDepot } from "../../fixtures/depot-process.js";
import { publish, startDepot, tempDir } from "../../fixtures/depot.js";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import { generateSigningKey, signingKeyFromPem, trustedKeyEntry } from "../../../src/depot/signing/keys.js";

const cleanups: Array<() => Promise<unknown>> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

let cli = "";
beforeAll(async () => {
  const built = await bundleCli();
  cleanups.push(built.remove);
  cli = built.file;
}, 120_000);

/** Runs the CLI; `killAfterLines` SIGKILLs it once that many stdout lines came. */
function run(
  args: string[],
  killAfterLines?: number,
): Promise<{ code: number | null; signal: string | null; lines: string[]; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [cli, ...args], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => {
      out += chunk.toString();
      if (killAfterLines !== undefined && out.split("\n").length - 1 >= killAfterLines) child.kill("SIGKILL");
    });
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    child.once("exit", (code, signal) =>
      resolve({ code, signal, lines: out.split("\n").filter((l) => l !== ""), stderr }),
    );
  });
}

describe("runner-depot mirror", () => {
  it("killed mid-mirror, run again, copies every version once; a rerun copies nothing", async () => {
    const tmp = await tempDir("cli-mirror-");
    cleanups.push(tmp.cleanup);
    const up = await spawnDepot(`${tmp.dir}/up`, 0, await bundleDepotServer(tmp.dir));
    cleanups.push(() => up.kill());
    const count = 8;
    for (let i = 0; i < count; i++)
      expect((await publish(up.url, `p${i % 2}@1.0.${i}`, [{ type: "file", path: "f", body: `b${i}` }])).status).toBe(
        201,
      );
    const data = `${tmp.dir}/data`;

    const killed = await run(["mirror", up.url, "--data", data], 2);
    expect(killed.signal).toBe("SIGKILL");
    const done = await run(["mirror", up.url, "--data", data]);
    expect(done.code, done.stderr).toBe(0);
    // The killed run's lines plus this run's cover every position, none twice past the kill point.
    const positions = done.lines.map((l) => (JSON.parse(l) as { position: number }).position);
    expect(positions.at(-1)).toBe(count);
    expect(positions[0]).toBeGreaterThanOrEqual(2);
    const again = await run(["mirror", up.url, "--data", data]);
    expect([again.code, again.lines]).toEqual([0, []]);
    expect(again.stderr).toContain("0 copied");

    const local = await startDepot(createFsStore(`${data}/depot`, { unsafeNoSync: true }));
    cleanups.push(() => local.close());
    const feedOf = async (url: string) =>
      (
        (await (await fetch(`${url}/catalog?since=0`)).json()) as { changes: Array<{ name: string; version: string }> }
      ).changes.map((c) => `${c.name}@${c.version}`);
    expect(await feedOf(local.url)).toEqual(await feedOf(up.url));
    for (const name of ["p0", "p1"]) {
      const [a, b] = await Promise.all([fetch(`${local.url}/version/${name}`), fetch(`${up.url}/version/${name}`)]);
      expect(await a.json()).toEqual(await b.json());
    }
  });

  it("--trusted-keys: copies a bundle signed by a trusted key, and stops at one that is not", async () => {
    const tmp = await tempDir("cli-mirror-keys-");
    cleanups.push(tmp.cleanup);
    const release = generateSigningKey();
    const other = generateSigningKey();
    const up = await startDepot(createFsStore(`${tmp.dir}/up`, { unsafeNoSync: true }), {
      trustedKeys: { keys: [trustedKeyEntry(release)] },
    });
    cleanups.push(() => up.close());
    await createDepotClient({ baseUrl: up.url }).publish({
      name: "tool",
      version: "1.0.0",
      items: [{ type: "file", path: "bin/tool", content: "echo 1\n" }],
      sign: signingKeyFromPem(release.privateKey),
    });
    const keysFile = async (name: string, key: ReturnType<typeof generateSigningKey>) => {
      await writeFile(`${tmp.dir}/${name}.json`, JSON.stringify({ keys: [trustedKeyEntry(key)] }));
      return `${tmp.dir}/${name}.json`;
    };
    const refused = await run([
      "mirror",
      up.url,
      "--data",
      `${tmp.dir}/a`,
      "--trusted-keys",
      await keysFile("other", other),
    ]);
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toContain("not trusted");
    const copied = await run([
      "mirror",
      up.url,
      "--data",
      `${tmp.dir}/b`,
      "--trusted-keys",
      await keysFile("release", release),
    ]);
    expect(copied.code, copied.stderr).toBe(0);
    expect(copied.lines.map((l) => (JSON.parse(l) as { outcome: string }).outcome)).toEqual(["copied", "attestation"]);
    expect(copied.stderr).toContain("1 attestations");
  });

  it("usage errors exit 2", async () => {
    expect((await run(["mirror"])).code).toBe(2);
    expect((await run(["mirror", "ftp://x"])).code).toBe(2);
    expect((await run(["mirror", "http://127.0.0.1:9", "--interval", "0"])).code).toBe(2);
  });
});
