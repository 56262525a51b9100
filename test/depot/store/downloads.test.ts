/**
 * Download hours through a real server (fs store): many downloads of one version in one hour make one write of its
 * package's `used/` record, the next hour one more; a HEAD, a version that is not published and an unknown package
 * make none.
 */
import { afterAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { publish, startDepot, tempDir } from "../../fixtures/depot.js";
import { handClock } from "../../fixtures/retention-scenario.js";

const cleanups: Array<() => Promise<unknown>> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

describe("download hours", () => {
  it("write at most once per version per hour, and never for what is not published", async () => {
    const tmp = await tempDir("depot-downloads-");
    cleanups.push(tmp.cleanup);
    const inner = createFsStore(tmp.dir, { unsafeNoSync: true });
    cleanups.push(async () => inner.close?.());
    const writes: string[] = [];
    const store = Object.create(inner) as PackageStore;
    store.putRecord = (key, value, cond) => {
      if (key.startsWith("used/")) writes.push(key);
      return inner.putRecord(key, value, cond);
    };
    const clock = handClock();
    const depot = await startDepot(store, { now: clock.now });
    cleanups.push(() => depot.close());
    expect((await publish(depot.url, "dl@1.0.0", [{ type: "file", path: "f", body: "x" }])).status).toBe(201);
    for (let i = 0; i < 50; i++) expect((await fetch(`${depot.url}/data/dl@1.0.0`)).status).toBe(200);
    expect((await fetch(`${depot.url}/data/dl@1.0.0`, { method: "HEAD" })).status).toBe(200);
    expect((await fetch(`${depot.url}/data/dl@9.9.9`)).status).toBe(404);
    expect((await fetch(`${depot.url}/data/nothing@1.0.0`)).status).toBe(404);
    await depot.router.idle();
    expect(writes).toEqual(["used/dl"]);
    clock.advance(3600_000);
    for (let i = 0; i < 10; i++) await fetch(`${depot.url}/data/dl`);
    await depot.router.idle();
    expect(writes).toEqual(["used/dl", "used/dl"]);
    const hours = (await inner.getRecord<{ versions: Record<string, number> }>("used/dl"))!.value.versions;
    expect(hours["1.0.0"]).toBe(Math.floor(clock.now().getTime() / 3600_000) * 3600_000);
  });
});
