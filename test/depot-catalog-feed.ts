/**
 * The change-feed checks shared by the fs and the PostgreSQL + S3 runs (not a test file):
 * concurrent commits of many packages each land exactly once in one order, and a paged walk
 * of the catalog while commits land sees every package that existed at its start once.
 */
import { expect } from "vitest";
import { add, openTransaction, type Addition } from "./fixtures/depot-helpers.js";

/**
 * Publishes through the real API, retrying a step that answers 503 STORE_UNAVAILABLE (as a
 * client should: s3rver fails some concurrent copies with an internal error).
 */
async function publish(url: string, spec: string, additions: Addition[]): Promise<Response> {
  const retrying = async (step: () => Promise<Response>): Promise<Response> => {
    for (let attempt = 0; ; attempt++) {
      const response = await step();
      if (response.status !== 503 || attempt === 5) return response;
      await response.arrayBuffer();
      await new Promise((resolve) => setTimeout(resolve, 50 * 2 ** attempt));
    }
  };
  const id = await openTransaction(url, spec);
  for (const a of additions) {
    const response = await retrying(() => add(url, id, a));
    if (response.status !== 201) throw new Error(`add ${JSON.stringify(a).slice(0, 80)}: ${response.status} ${await response.text()}`);
  }
  return retrying(() => fetch(`${url}/commit/${id}`, { method: "POST" }));
}

/** One `?since=` answer. */
export interface SinceAnswer {
  packages: Record<string, { latest: string; versions: string[] }>;
  position: number;
  changes: Array<{ position: number; name: string; version: string }>;
}

/** Every change after `since`, following `next` links, `limit` per answer. */
export async function walkChanges(url: string, since: number, limit: number): Promise<{ changes: SinceAnswer["changes"]; answers: number; position: number }> {
  const changes: SinceAnswer["changes"] = [];
  let next: string | null = `${url}/catalog?since=${since}&limit=${limit}`;
  let answers = 0;
  let position = since;
  while (next) {
    const response: Response = await fetch(next);
    expect(response.status).toBe(200);
    const body = (await response.json()) as SinceAnswer;
    changes.push(...body.changes);
    position = body.position;
    // Each answer carries the current record of every package it names.
    for (const change of body.changes) expect(body.packages[change.name]?.versions).toContain(change.version);
    answers++;
    const link = /^<([^>]+)>; rel="next"$/.exec(response.headers.get("link") ?? "");
    next = link ? new URL(link[1]!, next).href : null;
  }
  return { changes, answers, position };
}

/** Runs `fn` over `items` with at most `limit` in flight. */
async function pool<T>(items: T[], limit: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: limit }, async () => {
    while (next < items.length) await fn(items[next++]!);
  }));
}

/**
 * 50 packages committed at concurrency 16 (spread round-robin over `urls`, routers on one
 * store): all land, each once in the feed, one order for every reader.
 */
export async function concurrentCommitsLandOnceInOrder(urls: string[], prefix: string, packages = 50, concurrency = 16): Promise<void> {
  const url = urls[0]!;
  const start = ((await (await fetch(`${url}/catalog?limit=1`)).json()) as { position: number }).position;
  const names = Array.from({ length: packages }, (_, i) => `${prefix}-${i}`);
  const statuses: number[] = [];
  await pool(names, concurrency, async (name) => {
    const response = await publish(urls[names.indexOf(name) % urls.length]!, `${name}@1.0.0`, [{ type: "file", path: "f", body: name }]);
    statuses.push(response.status);
    await response.arrayBuffer();
  });
  expect(statuses).toEqual(names.map(() => 201));

  const first = await walkChanges(url, start, 7);
  const second = await walkChanges(urls.at(-1)!, start, 50);
  expect(first.answers).toBeGreaterThan(1); // the walk really paged
  // Dense positions, one per commit, the same order for both readers.
  expect(first.changes.map((c) => c.position)).toEqual(names.map((_, i) => start + i + 1));
  expect(second.changes).toEqual(first.changes);
  expect(first.changes.map((c) => c.name).sort()).toEqual([...names].sort());
  expect(first.position).toBe(start + packages);
  // The catalog's ETag moved to the head; a 304 there, and nothing after it.
  const head = await fetch(`${url}/catalog?since=${first.position}`);
  expect(((await head.json()) as SinceAnswer).changes).toEqual([]);
  expect((await fetch(`${url}/catalog`, { headers: { "If-None-Match": head.headers.get("etag")! } })).status).toBe(304);
}

/**
 * A paged walk of the catalog (pages of `pageSize`) while new packages and new versions of the
 * walked ones are committed between pages: every package that existed at the start is
 * seen exactly once, and no package twice.
 */
export async function pagedWalkWhileCommitsLand(url: string, prefix: string, existingCount = 30, pageSize = 4): Promise<void> {
  const before = Array.from({ length: existingCount }, (_, i) => `${prefix}-old-${i}`);
  await pool(before, 8, async (name) => {
    expect((await publish(url, `${name}@1.0.0`, [{ type: "file", path: "f", body: name }])).status).toBe(201);
  });
  const existing = Object.keys(((await (await fetch(`${url}/catalog?limit=5000`)).json()) as SinceAnswer).packages);
  const seen: string[] = [];
  let next: string | null = `${url}/catalog?limit=${pageSize}`;
  let page = 0;
  while (next) {
    const response: Response = await fetch(next);
    expect(response.status).toBe(200);
    seen.push(...Object.keys(((await response.json()) as SinceAnswer).packages));
    const link = /^<([^>]+)>; rel="next"$/.exec(response.headers.get("link") ?? "");
    next = link ? new URL(link[1]!, next).href : null;
    // Between pages: a new package, and a new version of a package already walked and of one still ahead.
    const walked = before[Math.min(page, before.length - 1)]!;
    const ahead = before[before.length - 1 - Math.min(page, before.length - 1)]!;
    await Promise.all([
      publish(url, `${prefix}-new-${page}@1.0.0`, [{ type: "file", path: "f", body: "n" }]),
      publish(url, `${walked}@1.0.${page + 1}`, [{ type: "file", path: "f", body: "w" }]),
      publish(url, `${ahead}@2.0.${page}`, [{ type: "file", path: "f", body: "a" }]),
    ]).then((answers) => Promise.all(answers.map((a) => a.arrayBuffer())));
    page++;
  }
  expect(page).toBeGreaterThan(existing.length / pageSize - 1);
  expect(new Set(seen).size).toBe(seen.length); // nothing twice
  for (const name of existing) expect(seen, name).toContain(name); // everything that existed, once
}
