/**
 * A retried commit that meets the first attempt's live sequencing claim (packages.ts), over
 * a real listening server on the fs store. The first attempt is held at its change append
 * (a store wrapper holds the `seq/` write) while the retry runs; then the first attempt
 * either dies there (the write fails, its claim is dead) or goes on. Either way the
 * version must end up in the change feed exactly once, also after a restart (recovery on
 * open), and the retry's 200 must not come before the entry exists.
 */
import { afterEach, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import { add, openTransaction, startDepot, tempDir, type LiveDepot } from "../../fixtures/depot.js";

/** Holds the first change append for `name` until released; notes reads of `pkg/<name>` meanwhile. */
function holdingStore(inner: PackageStore, name: string) {
  let armed = true;
  let held = false;
  let pkgReadsWhileHeld = 0;
  let settle!: (outcome: "fail" | "go") => void;
  const gate = new Promise<"fail" | "go">((resolve) => (settle = resolve));
  let reached!: () => void;
  const atAppend = new Promise<void>((resolve) => (reached = resolve));
  const store = new Proxy(inner, {
    get(target, prop, receiver) {
      const value = Reflect.get(target, prop, receiver) as unknown;
      if (prop === "putRecord") {
        return async (key: string, record: { name?: string }, cond: unknown) => {
          if (armed && key.startsWith("seq/") && record?.name === name) {
            armed = false;
            held = true;
            reached();
            const outcome = await gate;
            held = false;
            if (outcome === "fail") throw new Error("injected: the first attempt dies before its change entry");
          }
          return (target.putRecord as (...a: unknown[]) => Promise<string | null>).call(target, key, record, cond);
        };
      }
      if (prop === "getRecord") {
        return (key: string) => {
          if (held && key === `pkg/${name}`) pkgReadsWhileHeld++;
          return target.getRecord(key);
        };
      }
      return typeof value === "function" ? (value as (...a: unknown[]) => unknown).bind(target) : value;
    },
  });
  return { store, atAppend, release: (outcome: "fail" | "go") => settle(outcome), pkgReads: () => pkgReadsWhileHeld };
}

interface SinceAnswer {
  changes: Array<{ name: string; version: string }>;
}

async function feedCount(url: string, name: string): Promise<number> {
  const response = await fetch(`${url}/catalog?since=0`);
  expect(response.status).toBe(200);
  const body = (await response.json()) as SinceAnswer;
  return body.changes.filter((c) => c.name === name && c.version === "1.0.0").length;
}

async function until(condition: () => boolean): Promise<void> {
  while (!condition()) await new Promise((resolve) => setTimeout(resolve, 5));
}

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()!().catch(() => undefined);
});

/** First commit held at its append, a retry sent and seen at the package record, then the first attempt fails or goes on. */
async function retryMeetsLiveClaim(outcome: "fail" | "go"): Promise<{ first: Response; retry: Response; dir: string }> {
  const tmp = await tempDir("depot-retry-claim-");
  cleanups.push(tmp.cleanup);
  const inner = createFsStore(tmp.dir);
  const held = holdingStore(inner, "held");
  const depot: LiveDepot = await startDepot(held.store);
  let closed = false;
  cleanups.push(async () => {
    if (!closed) {
      await depot.close();
      await inner.close?.();
    }
  });
  const id = await openTransaction(depot.url, "held@1.0.0");
  expect((await add(depot.url, id, { type: "file", path: "a.txt", body: "a\n" })).status).toBe(201);

  const first = fetch(`${depot.url}/commit/${id}`, { method: "POST" });
  await held.atAppend; // listed, claim live, entry not appended
  let retryAnswered = false;
  const retry = fetch(`${depot.url}/commit/${id}`, { method: "POST" }).finally(() => (retryAnswered = true));
  // The retry has reached the sequencing claim (it reads the package record).
  await until(() => held.pkgReads() > 0 || retryAnswered);
  held.release(outcome);
  const answers = { first: await first, retry: await retry };
  await depot.close();
  await depot.router.idle?.();
  await inner.close?.();
  closed = true;
  return { ...answers, dir: tmp.dir };
}

/** A fresh process's view: a new store and router on the same directory (recovery runs on open). */
async function restartedFeedCount(dir: string): Promise<number> {
  const store = createFsStore(dir);
  const depot = await startDepot(store);
  try {
    return await feedCount(depot.url, "held");
  } finally {
    await depot.close();
    await store.close?.();
  }
}

describe("a retried commit and a live sequencing claim (fs store)", () => {
  it("the first attempt dies before its change entry: the retry sequences the version, exactly once", async () => {
    const { first, retry, dir } = await retryMeetsLiveClaim("fail");
    expect(first.status).toBeGreaterThanOrEqual(500);
    expect([200, 201]).toContain(retry.status);
    expect(await restartedFeedCount(dir)).toBe(1);
  }, 60_000);

  it("both attempts go on: both answer the same body and the version is sequenced exactly once", async () => {
    const { first, retry, dir } = await retryMeetsLiveClaim("go");
    expect(first.status).toBe(201);
    expect([200, 201]).toContain(retry.status);
    expect(await retry.json()).toEqual(await first.json());
    expect(await restartedFeedCount(dir)).toBe(1);
  }, 60_000);
});

describe("the depot client's commit and a live sequencing claim", () => {
  // The retried commit waits for the first attempt's claim (up to 30 s on the server) and is
  // answered 409 CONFLICT ("retry"): the client must commit again, not report a publish
  // that is going through as failed.
  it("a lost commit answer, a retry answered 409 while the first attempt still sequences: the client retries and publish succeeds", async () => {
    const tmp = await tempDir("depot-retry-claim-client-");
    cleanups.push(tmp.cleanup);
    const inner = createFsStore(tmp.dir);
    const held = holdingStore(inner, "held");
    const depot: LiveDepot = await startDepot(held.store);
    cleanups.push(async () => {
      await depot.close();
      await inner.close?.();
    });
    let commits = 0;
    let lostAnswer: Promise<unknown> = Promise.resolve();
    const conflicts: number[] = [];
    const fetchThrough: typeof fetch = async (input, init) => {
      const target = String(input instanceof Request ? input.url : input);
      if (init?.method !== "POST" || !target.includes("/commit/")) return fetch(input, init);
      commits++;
      if (commits === 1) {
        // The first commit reaches the server and holds at its change append; its answer is lost.
        lostAnswer = fetch(input, init)
          .then((r) => r.body?.cancel())
          .catch(() => undefined);
        await held.atAppend;
        throw new TypeError("fetch failed");
      }
      const response = await fetch(input, init);
      if (response.status === 409) {
        conflicts.push(commits);
        held.release("go"); // the first attempt goes on and drops its claim
      }
      return response;
    };
    const client = createDepotClient({ baseUrl: depot.url, fetch: fetchThrough, retryDelayMs: 10 });
    const done = await client.publish({
      name: "held",
      version: "1.0.0",
      items: [{ type: "file", path: "a.txt", content: "a\n" }],
    });
    await lostAnswer;
    expect(done.version).toBe("1.0.0");
    expect(conflicts).toEqual([2]);
    expect(await feedCount(depot.url, "held")).toBe(1);
  }, 120_000);
});

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A server whose first commit of `held@1.0.0` is held at its change append (its claim live). */
async function heldCommit(prefix: string) {
  const tmp = await tempDir(prefix);
  cleanups.push(tmp.cleanup);
  const inner = createFsStore(tmp.dir, { unsafeNoSync: true });
  const held = holdingStore(inner, "held");
  const depot: LiveDepot = await startDepot(held.store);
  cleanups.push(async () => {
    held.release("go");
    await depot.close();
    await depot.router.idle?.();
    await inner.close?.();
  });
  const id = await openTransaction(depot.url, "held@1.0.0");
  expect((await add(depot.url, id, { type: "file", path: "a.txt", body: "a\n" })).status).toBe(201);
  const first = fetch(`${depot.url}/commit/${id}`, { method: "POST" });
  await held.atAppend; // listed, claim live, entry not appended
  return { depot, held, id, first };
}

describe("a retried commit waiting for a live claim (Session 9)", () => {
  // The wait re-reads pkg/<name> every 5–100 ms for up to 30 s; a client that hung up
  // must not keep it going (before the fix it polled on for the whole 30 s).
  it("stops re-reading the package record once its client hangs up; the transaction stays committing, and a later retry commits one change entry", async () => {
    const { depot, held, id, first } = await heldCommit("depot-retry-gone-");
    const hangUp = new AbortController();
    const retry = fetch(`${depot.url}/commit/${id}`, { method: "POST", signal: hangUp.signal }).catch(
      (error: unknown) => error,
    );
    await until(() => held.pkgReads() >= 3); // polling
    hangUp.abort();
    expect(await retry).toMatchObject({ name: "AbortError" });
    // The next poll (at most 100 ms on) sees the closed socket and stops.
    await sleep(400);
    const afterStop = held.pkgReads();
    await sleep(1_000);
    expect(held.pkgReads()).toBe(afterStop);
    // Nothing stored is lost: the first attempt is live, so the transaction stays `committing`.
    const summary = await fetch(`${depot.url}/summary/${id}`);
    expect(summary.status).toBe(200);
    expect(((await summary.json()) as { state: string }).state).toBe("committing");
    // The first attempt dies before its entry; a later retry takes its claim over and sequences it.
    held.release("fail");
    expect((await first).status).toBeGreaterThanOrEqual(500);
    const later = await fetch(`${depot.url}/commit/${id}`, { method: "POST" });
    expect([200, 201]).toContain(later.status);
    expect(await feedCount(depot.url, "held")).toBe(1);
  }, 30_000);

  // Each wait polls a record; a packager must not be able to keep unboundedly many going.
  it("waits at most 32 at once per server: the 33rd retry meeting the claim answers 409 CONFLICT at once, the waiting ones go on", async () => {
    const { depot, held, id, first } = await heldCommit("depot-retry-bound-");
    const retries = Array.from({ length: 32 }, () => fetch(`${depot.url}/commit/${id}`, { method: "POST" }));
    // Every waiter has read the record at least once and is polling.
    await until(() => held.pkgReads() >= 32 * 2);
    const started = Date.now();
    const extra = await fetch(`${depot.url}/commit/${id}`, { method: "POST" });
    expect(extra.status).toBe(409);
    expect(((await extra.json()) as { code: string }).code).toBe("CONFLICT");
    expect(Date.now() - started).toBeLessThan(5_000);
    held.release("go");
    expect((await first).status).toBe(201);
    for (const answer of await Promise.all(retries)) expect([200, 201]).toContain(answer.status);
    expect(await feedCount(depot.url, "held")).toBe(1);
  }, 60_000);
});

describe("a commit that dies after its version record is written (Session 9 review)", () => {
  // The version is listed (visible to readers) once its record is written and claimed; if
  // the attempt then dies before its change entry and the transaction went back to `open`,
  // an abandon (or expiry) left it visible and out of the change feed for good. Left
  // `committing` instead, recovery rolls it forward (its next request, gc, a restart).
  async function listed(url: string): Promise<string[]> {
    const response = await fetch(`${url}/version/held`);
    return response.status === 200
      ? ((await response.json()) as { versions: Array<{ version: string }> }).versions.map((v) => v.version)
      : [];
  }

  it("no retry: the client's abandon finds it rolled forward (410), never a listed version missing from the feed", async () => {
    const { depot, held, id, first } = await heldCommit("depot-dies-after-record-");
    held.release("fail");
    expect((await first).status).toBeGreaterThanOrEqual(500);
    const abandon = await fetch(`${depot.url}/trans/${id}`, { method: "DELETE" });
    expect(abandon.status).toBe(410);
    expect(((await abandon.json()) as { code: string }).code).toBe("TRANSACTION_COMMITTED");
    expect(await listed(depot.url)).toEqual(["1.0.0"]);
    expect(await feedCount(depot.url, "held")).toBe(1);
  }, 30_000);

  it("a retry whose client hung up no longer takes the claim over; the transaction still ends committed with one change entry", async () => {
    const { depot, held, id, first } = await heldCommit("depot-dies-after-gone-");
    const hangUp = new AbortController();
    const retry = fetch(`${depot.url}/commit/${id}`, { method: "POST", signal: hangUp.signal }).catch(
      (error: unknown) => error,
    );
    await until(() => held.pkgReads() >= 3);
    hangUp.abort();
    await retry;
    await sleep(400); // the wait has stopped (previous describe)
    held.release("fail");
    expect((await first).status).toBeGreaterThanOrEqual(500);
    const summary = (await (await fetch(`${depot.url}/summary/${id}`)).json()) as { state: string };
    expect(summary.state).toBe("committed");
    expect((await fetch(`${depot.url}/trans/${id}`, { method: "DELETE" })).status).toBe(410);
    expect(await listed(depot.url)).toEqual(["1.0.0"]);
    expect(await feedCount(depot.url, "held")).toBe(1);
  }, 30_000);
});
