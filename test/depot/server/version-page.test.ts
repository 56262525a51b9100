/**
 * Issue 30 item 4 over real sockets: `/version/<name>` answers in pages bounded by count
 * and bytes; the first page is the old answer's shape, and `Link: rel="next"` walks the rest.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMemoryStore } from "../../../src/adapters/memory/store.js";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import { add, openTransaction, startDepot, type LiveDepot } from "../../fixtures/depot.js";

type VersionAnswer = { name: string; latest: string; versions: Array<{ version: string; attributes: object }> };

const VERSIONS = 12;
const ATTRIBUTES = 30;

describe("/version pages (issue 30 item 4)", () => {
  let depot: LiveDepot;
  beforeAll(async () => {
    depot = await startDepot(createMemoryStore());
    // 12 versions of 30 attributes of 4,000 bytes: 1.44 MB in one answer before.
    for (let v = 1; v <= VERSIONS; v++) {
      const id = await openTransaction(depot.url, `wide@${v}.0.0`);
      for (let a = 0; a < ATTRIBUTES; a += 3) {
        const attrs: Record<string, string> = {};
        for (let k = a; k < a + 3; k++) attrs[`attr${k}`] = String(k % 10).repeat(4000);
        expect((await add(depot.url, id, { type: "set", attrs })).status).toBe(201);
      }
      expect((await fetch(`${depot.url}/commit/${id}`, { method: "POST" })).status).toBe(201);
    }
  }, 120_000);
  afterAll(() => depot.close());

  it("bounds the first answer to about 1 MiB and walks every version once through Link rel=next", async () => {
    const first = await fetch(`${depot.url}/version/wide`);
    const text = await first.text();
    expect(first.status).toBe(200);
    expect(Buffer.byteLength(text)).toBeLessThan(1024 * 1024 + 130_000);
    const body = JSON.parse(text) as VersionAnswer;
    expect(body.latest).toBe(`${VERSIONS}.0.0`);
    expect(body.versions.length).toBeLessThan(VERSIONS);
    const seen = body.versions.map((v) => v.version);
    let link = first.headers.get("link");
    while (link !== null) {
      const next = /^<([^>]+)>; rel="next"$/.exec(link);
      expect(next, link).not.toBeNull();
      const page = await fetch(new URL(next![1]!, depot.url));
      expect(page.status).toBe(200);
      seen.push(...((await page.json()) as VersionAnswer).versions.map((v) => v.version));
      link = page.headers.get("link");
    }
    expect(seen).toEqual(Array.from({ length: VERSIONS }, (_, i) => `${i + 1}.0.0`));
  });

  it("the client's versions() follows every page, so the installer sees the latest version", async () => {
    const info = await createDepotClient({ baseUrl: depot.url }).versions("wide");
    expect(info.versions.map((v) => v.version)).toEqual(Array.from({ length: VERSIONS }, (_, i) => `${i + 1}.0.0`));
    // Within the client's page bound: one page fewer than the chain is refused, not cut short.
    const short = createDepotClient({ baseUrl: depot.url, maxCatalogPages: 1 }).versions("wide");
    await expect(short).rejects.toMatchObject({ code: "TOO_LARGE" });
  });

  it("honours limit, refuses a bad one, and the existing client still reads the first answer", async () => {
    const two = await fetch(`${depot.url}/version/wide?limit=2`);
    expect(((await two.json()) as VersionAnswer).versions.map((v) => v.version)).toEqual(["1.0.0", "2.0.0"]);
    expect(two.headers.get("link")).toBe('</version/wide?limit=2&after=2.0.0>; rel="next"');
    const bad = await fetch(`${depot.url}/version/wide?limit=4001`);
    expect([bad.status, ((await bad.json()) as { code: string }).code]).toEqual([400, "BAD_REQUEST"]);
    const info = await createDepotClient({ baseUrl: depot.url }).versions("wide");
    expect(info.latest).toBe(`${VERSIONS}.0.0`);
    expect(info.versions[0]!.version).toBe("1.0.0");
    expect(Object.keys(info.versions[0]!.attributes)).toHaveLength(ATTRIBUTES);
  });
});
