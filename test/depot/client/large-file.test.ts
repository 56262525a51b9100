/**
 * A 1 GiB file published and downloaded through a depot running in a child process
 * (fs store): the digests match and the server's resident memory grows by less than
 * 192 MiB, far below the GiB a server that buffered the file would add. The data is generated on the fly into a temp file and removed afterwards.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { createReadStream } from "node:fs";
import { mkdtemp, open, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import tar from "tar-stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import { stopChild } from "../../fixtures/stop-child.js";

const GiB = 2 ** 30;
const MiB = 2 ** 20;
const here = path.dirname(fileURLToPath(import.meta.url));

let tmp: string;
let child: ChildProcess | undefined;
let url: string;
let pid: number;

/** A field of /proc/<pid>/status in bytes (VmRSS: now, VmHWM: the peak so far). */
async function memory(field: "VmRSS" | "VmHWM"): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, "utf8");
  const kb = new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(status);
  if (!kb) throw new Error(`no ${field} in /proc/${pid}/status`);
  return Number(kb[1]) * 1024;
}

beforeAll(async () => {
  tmp = await mkdtemp(path.join(os.tmpdir(), "depot-large-"));
  child = spawn(
    process.execPath,
    [
      "--import",
      "tsx",
      path.join(here, "..", "..", "fixtures", "depot-client-server.ts"),
      path.join(tmp, "store"),
      "--unsafe-no-sync",
    ],
    {
      stdio: ["pipe", "pipe", "inherit"],
    },
  );
  const first = await new Promise<string>((resolve, reject) => {
    const lines = createInterface({ input: child!.stdout! });
    lines.once("line", resolve);
    child!.once("exit", (code) => reject(new Error(`depot server exited with ${code}`)));
  });
  ({ url, pid } = JSON.parse(first) as { url: string; pid: number });
}, 60_000);

afterAll(async () => {
  await stopChild(child);
  await rm(tmp, { recursive: true, force: true });
});

describe("a 1 GiB package", () => {
  it("publishes and downloads with matching digests and under 192 MiB of server memory growth", async () => {
    const client = createDepotClient({ baseUrl: url });
    // Warm the server's code paths first, so the baseline is not its cold start.
    await client.publish({
      name: "warm",
      version: "1.0.0",
      items: [{ type: "file", path: "w", content: randomBytes(4 * MiB) }],
    });
    await client.download("warm@1.0.0", { to: path.join(tmp, "warm.tar") });
    const baseline = await memory("VmRSS");

    // 1 GiB, each MiB different (a random block with its index stamped in).
    const source = path.join(tmp, "big.bin");
    const block = randomBytes(MiB);
    const hash = createHash("sha256");
    const fh = await open(source, "w");
    for (let i = 0; i < GiB / MiB; i++) {
      block.writeUInt32BE(i, 0);
      hash.update(block);
      await fh.write(block);
    }
    await fh.close();
    const sourceDigest = `sha256:${hash.digest("hex")}`;

    const published = await client.publish({
      name: "huge",
      version: "1.0.0",
      items: [{ type: "file", path: "big.bin", file: source, mode: 0o644 }],
    });
    expect(published.bytesSent).toBe(GiB);
    await rm(source);

    const archive = path.join(tmp, "huge.tar");
    const downloaded = await client.download("huge@1.0.0", { to: archive });
    expect(downloaded.digest).toBe(published.digest);
    expect(downloaded.size).toBeGreaterThan(GiB);
    const info = await client.versions("huge");
    expect(info.versions[0]).toMatchObject({ version: "1.0.0", digest: published.digest, size: downloaded.size });

    // The file inside the downloaded archive is byte for byte the one published.
    const extract = tar.extract();
    createReadStream(archive).pipe(extract as unknown as NodeJS.WritableStream);
    const found: Record<string, string> = {};
    for await (const entry of extract) {
      const h = createHash("sha256");
      for await (const chunk of entry as unknown as AsyncIterable<Buffer>) h.update(chunk);
      found[entry.header.name] = `sha256:${h.digest("hex")}`;
    }
    expect(found["big.bin"]).toBe(sourceDigest);
    const manifest = await client.manifest("huge@1.0.0");
    expect(manifest.items).toEqual([
      expect.objectContaining({ type: "file", path: "big.bin", size: GiB, digest: sourceDigest }),
    ]);
    await rm(archive);

    const peak = await memory("VmHWM");
    const growth = peak - baseline;
    console.log(
      `depot-large: server RSS baseline ${(baseline / MiB).toFixed(1)} MiB, peak ${(peak / MiB).toFixed(1)} MiB, growth ${(growth / MiB).toFixed(1)} MiB`,
    );
    // CI runs saw +30, +50 and +74 MiB: peak RSS counts garbage not yet collected (less idle
    // time for GC on a loaded machine) and pages the allocator keeps, so 100 MiB was within
    // reach. A server that held the file would add a GiB; 192 MiB is still far from that.
    expect(growth).toBeLessThan(192 * MiB);
  }, 300_000);
});
