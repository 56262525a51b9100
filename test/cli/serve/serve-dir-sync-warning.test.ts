/**
 * What `serve` tells its operator when the data folder's filesystem cannot fsync a
 * directory (review 2): the stores then skip directory fsyncs (durable.ts), so a rename may
 * not survive a machine crash. The one place serve's operator is told to read is its log
 * (README, "Operating serve": pino JSON lines on stderr), so the notice must be a line
 * there, also where Node's own warnings are off (NODE_NO_WARNINGS=1, as in many images).
 * A real serve process built as the published CLI; its directory fsyncs are made to fail
 * with EINVAL by a module loaded before it (`--import`), as such a filesystem answers.
 */
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bundleCli, spawnJsonLogged } from "../../fixtures/cli-bundle.js";

/** Makes FileHandle#sync of a directory fail with EINVAL in the process that imports it. */
const PATCH = `
import { open } from "node:fs/promises";
import { readlinkSync, statSync } from "node:fs";
const probe = await open(".", "r");
const proto = Object.getPrototypeOf(probe);
await probe.close();
const original = proto.sync;
proto.sync = function () {
  if (!statSync(readlinkSync("/proc/self/fd/" + this.fd)).isDirectory()) return original.call(this);
  return Promise.reject(Object.assign(new Error("EINVAL: invalid argument, fsync"), { code: "EINVAL", errno: -22, syscall: "fsync" }));
};
`;

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe.skipIf(process.platform !== "linux")("serve on a filesystem that cannot fsync a directory (review 2)", () => {
  let bundle: Awaited<ReturnType<typeof bundleCli>>;
  let dir: string;
  beforeAll(async () => {
    bundle = await bundleCli();
    dir = await mkdtemp(path.join(tmpdir(), "serve-dir-fsync-"));
  }, 120_000);
  afterAll(async () => {
    await bundle?.remove();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it("says so in its JSON log, with the warning's code, even with Node's warnings off", async () => {
    const patch = path.join(dir, "einval-dir-fsync.mjs");
    await writeFile(patch, PATCH);
    const { child, logs, exited } = spawnJsonLogged(
      [
        "--import",
        pathToFileURL(patch).href,
        bundle.file,
        "serve",
        "--data",
        path.join(dir, "data"),
        "--runner-port",
        "0",
        "--depot-port",
        "0",
        "--log-format",
        "json",
      ],
      { ...process.env, NODE_NO_WARNINGS: "1" },
    );
    try {
      for (let i = 0; i < 600 && child.exitCode === null && !logs.some((l) => l.msg === "runner-depot serving"); i++)
        await pause(100);
      const serving = logs.find((l) => l.msg === "runner-depot serving");
      expect(serving, JSON.stringify(logs)).toBeDefined();
      // readiness probes both stores, which opens them: their directories are fsynced then.
      const ready = await fetch(`${String(serving!.depotUrl)}/readyz`);
      expect(ready.status).toBe(200);
      for (let i = 0; i < 100 && !logs.some((l) => l.code === "RUNNER_DEPOT_DIR_FSYNC_UNSUPPORTED"); i++)
        await pause(50);
      const notice = logs.find((l) => l.code === "RUNNER_DEPOT_DIR_FSYNC_UNSUPPORTED");
      expect(notice, JSON.stringify(logs)).toMatchObject({ level: 40 });
      expect(String(notice!.msg)).toMatch(/fsync of the directory .* is not supported here \(EINVAL\)/);
    } finally {
      child.kill("SIGTERM");
      await exited;
    }
  }, 120_000);
});
