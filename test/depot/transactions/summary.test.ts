/**
 * Large transactions over real HTTP (issue 9, depot 7): `GET /summary` answers in pages
 * (limit, opaque `after`, `next`, `Link: rel="next"`) and a walk sees every item exactly
 * once, open or committed; concurrent additions counted together on the transaction
 * record keep the item limit exact.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMemoryStore } from "../../../src/adapters/memory/store.js";
import { add, openTransaction, startDepot, type LiveDepot } from "../../fixtures/depot.js";

interface Page {
  items: Array<{ path: string }>;
  next: string | null;
  totals: { items: number; bytes: number };
  state: string;
}

/** Follows `Link: rel="next"` from `first`; checks each page's `next` agrees with the header. */
async function walk(url: string, first: string): Promise<{ pages: Page[]; paths: string[] }> {
  const pages: Page[] = [];
  let next: string | null = first;
  while (next !== null) {
    const response: Response = await fetch(url + next);
    expect(response.status).toBe(200);
    const page = (await response.json()) as Page;
    const link = response.headers.get("link");
    if (page.next === null) expect(link).toBeNull();
    else expect(link).toMatch(new RegExp(`^<[^>]*after=${page.next}[^>]*>; rel="next"$`));
    pages.push(page);
    next = link ? /^<([^>]+)>/.exec(link)![1]! : null;
    expect(next === null || next.startsWith("/")).toBe(true); // relative: no Host reflected
  }
  return { pages, paths: pages.flatMap((p) => p.items.map((i) => i.path)) };
}

describe("summary pages", () => {
  let depot: LiveDepot;
  let id: string;
  const N = 1_250;
  const expected = Array.from({ length: N }, (_, i) => `d${i % 7}/f${String(i).padStart(4, "0")}`);

  beforeAll(async () => {
    depot = await startDepot(createMemoryStore());
    id = await openTransaction(depot.url, "paged@1.0.0");
    let next = 0;
    const worker = async () => {
      while (next < N) {
        const path = expected[next++]!;
        const r = await add(depot.url, id, { type: "file", path, body: path });
        expect(r.status).toBe(201);
        await r.arrayBuffer();
      }
    };
    await Promise.all(Array.from({ length: 8 }, worker));
  }, 60_000);
  afterAll(() => depot.close());

  it("walks an open transaction page by page: every item exactly once, totals on every page", async () => {
    const { pages, paths } = await walk(depot.url, `/summary/${id}?limit=300`);
    expect(pages.length).toBe(Math.ceil(N / 300));
    expect(pages.slice(0, -1).every((p) => p.items.length === 300)).toBe(true);
    expect(paths.length).toBe(N);
    expect(new Set(paths).size).toBe(N);
    expect([...paths].sort()).toEqual([...expected].sort());
    for (const page of pages) expect(page.totals.items).toBe(N);
    // The default page is 1,000 items.
    const first = (await (await fetch(`${depot.url}/summary/${id}`)).json()) as Page;
    expect(first.items.length).toBe(1_000);
    expect(first.next).not.toBeNull();
  });

  it("refuses a bad limit or cursor with 400 BAD_REQUEST", async () => {
    for (const query of ["limit=0", "limit=10001", "limit=abc", "after=zz", `after=${"g".repeat(64)}`, "after=12"]) {
      const r = await fetch(`${depot.url}/summary/${id}?${query}`);
      expect({ query, status: r.status, code: ((await r.json()) as { code: string }).code }).toEqual({
        query,
        status: 400,
        code: "BAD_REQUEST",
      });
    }
  });

  it("pages a committed transaction in archive order", async () => {
    expect((await fetch(`${depot.url}/commit/${id}`, { method: "POST" })).status).toBe(201);
    const { pages, paths } = await walk(depot.url, `/summary/${id}?limit=500`);
    expect(pages.every((p) => p.state === "committed")).toBe(true);
    expect(paths).toEqual([...expected].sort());
  });
});

describe("the item limit under concurrent additions", () => {
  let depot: LiveDepot;
  beforeAll(async () => {
    depot = await startDepot(createMemoryStore(), { limits: { items: 40 } });
  });
  afterAll(() => depot.close());

  it("accepts exactly the limit when 100 additions race, and counts exactly those", async () => {
    const id = await openTransaction(depot.url, "limited@1.0.0");
    const answers = await Promise.all(
      Array.from({ length: 100 }, async (_, i) => {
        const r = await add(depot.url, id, { type: "file", path: `f${i}`, body: `${i}` });
        return { status: r.status, code: ((await r.json()) as { code?: string }).code };
      }),
    );
    expect(answers.filter((a) => a.status === 201).length).toBe(40);
    expect(answers.filter((a) => a.status === 413).every((a) => a.code === "TOO_MANY_ITEMS")).toBe(true);
    expect(answers.filter((a) => a.status === 413).length).toBe(60);
    const summary = (await (await fetch(`${depot.url}/summary/${id}`)).json()) as Page;
    expect(summary.totals.items).toBe(40);
    expect(summary.items.length).toBe(40);
    const commit = await fetch(`${depot.url}/commit/${id}`, { method: "POST" });
    expect(commit.status).toBe(201);
  });
});
