/**
 * Twenty transactions race to commit the same version: exactly one wins (201), the others
 * get 409, and catalog, version, depend and data all agree on the winner. Run on the
 * memory store and on one fs directory shared by two server processes.
 */
import { afterAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { createMemoryStore } from "../../../src/adapters/memory/store.js";
import { add, openTransaction, parseTar, startDepot, storeDigest, tempDir } from "../../fixtures/depot.js";
import { spawnDepot, type DepotProcess } from "../../fixtures/depot-process.js";

async function race(urls: string[]): Promise<void> {
  const contenders = await Promise.all(
    Array.from({ length: 20 }, async (_, i) => {
      const url = urls[i % urls.length]!;
      const id = await openTransaction(url, "racer@1.0.0");
      expect((await add(url, id, { type: "file", path: "who", body: `contender ${i}` })).status).toBe(201);
      expect((await add(url, id, { type: "require", requires: [`dep-${i}@^1`] })).status).toBe(201);
      return { url, id, i };
    }),
  );
  const results = await Promise.all(
    contenders.map(async (c) => {
      const response = await fetch(`${c.url}/commit/${c.id}`, { method: "POST" });
      return { ...c, status: response.status, body: (await response.json()) as Record<string, unknown> };
    }),
  );
  const winners = results.filter((r) => r.status === 201);
  expect(winners).toHaveLength(1);
  const losers = results.filter((r) => r.status !== 201);
  expect(losers.map((r) => [r.status, r.body.code])).toEqual(losers.map(() => [409, "VERSION_EXISTS"]));
  const winner = winners[0]!;

  for (const url of urls) {
    const catalog = (await (await fetch(`${url}/catalog`)).json()) as {
      packages: Record<string, { versions: string[] }>;
    };
    expect(catalog.packages.racer!.versions).toEqual(["1.0.0"]);
    const version = (await (await fetch(`${url}/version/racer`)).json()) as { versions: Array<{ digest: string }> };
    expect(version.versions).toHaveLength(1);
    expect(version.versions[0]!.digest).toBe(winner.body.digest);
    expect(await (await fetch(`${url}/depend/racer`)).json()).toEqual({
      name: "racer",
      version: "1.0.0",
      requires: [{ name: `dep-${winner.i}`, range: "^1" }],
    });
    const bytes = new Uint8Array(await (await fetch(`${url}/data/racer@1.0.0`)).arrayBuffer());
    expect(storeDigest(bytes)).toBe(winner.body.digest);
    const entries = await parseTar(bytes);
    expect(entries.find((e) => e.name === "who")!.body.toString()).toBe(`contender ${winner.i}`);
    // The winner's transaction answers its summary; a loser stays open and may be abandoned.
    expect(((await (await fetch(`${winner.url}/summary/${winner.id}`)).json()) as { state: string }).state).toBe(
      "committed",
    );
  }
  const loser = losers[0]!;
  expect(((await (await fetch(`${loser.url}/summary/${loser.id}`)).json()) as { state: string }).state).toBe("open");
  expect((await fetch(`${loser.url}/trans/${loser.id}`, { method: "DELETE" })).status).toBe(204);
}

describe("concurrent commits of one version", () => {
  it("memory store: exactly one 201, nineteen 409, and every view agrees", async () => {
    const depot = await startDepot(createMemoryStore());
    try {
      await race([depot.url]);
    } finally {
      await depot.close();
    }
  });

  const cleanups: Array<() => Promise<void>> = [];
  afterAll(async () => {
    for (const c of cleanups.reverse()) await c();
  });

  it("fs store shared by two server processes: exactly one 201, and both servers agree", async () => {
    const tmp = await tempDir();
    cleanups.push(tmp.cleanup);
    const local = await startDepot(createFsStore(tmp.dir));
    cleanups.push(() => local.close());
    const remote: DepotProcess = await spawnDepot(tmp.dir);
    cleanups.push(() => remote.kill());
    await race([local.url, remote.url]);
  });
});
