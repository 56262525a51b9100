/**
 * The mirror's reads of a hostile upstream end on their own: a feed that says `more` without moving is refused,
 * an answer whose head never comes and an error body that drips are cut at the configured bounds, and
 * pull-through's slots are free again once they are. Real `node:http` upstreams on 127.0.0.1, real `fetch`;
 * bounds of a few hundred ms, and every check is "settled before a generous deadline", never a speed.
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import { afterAll, describe, expect, it } from "vitest";
import { createMemoryStore } from "../../../src/adapters/memory/store.js";
import { mirrorDepot } from "../../../src/depot/mirror/mirror.js";
import { Upstream, UPSTREAM_LIMITS } from "../../../src/depot/mirror/upstream.js";
import { startDepot } from "../../fixtures/depot.js";

const cleanups: Array<() => Promise<unknown>> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

/** A plain HTTP server on 127.0.0.1 answering with `handle`; counts requests, destroys its sockets on close. */
async function hostile(handle: (req: IncomingMessage, res: ServerResponse, url: URL) => void) {
  let requests = 0;
  const sockets = new Set<Socket>();
  const server = createServer((req, res) => {
    requests++;
    handle(req, res, new URL(req.url!, "http://x"));
  });
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const close = () =>
    new Promise<void>((resolve) => {
      for (const s of sockets) s.destroy();
      server.close(() => resolve());
    });
  cleanups.push(close);
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, requests: () => requests };
}

/** Answers nothing: the request is read, no head is ever sent. */
const silent = () => undefined;

/** A status and headers at once, then one byte every `everyMs` for ever (never ends). */
function drip(res: ServerResponse, status: number, everyMs: number) {
  res.writeHead(status, { "content-type": "application/json" });
  res.flushHeaders();
  const timer = setInterval(() => res.write(" "), everyMs);
  res.on("close", () => clearInterval(timer));
}

type Outcome = { settled: "resolved"; value: unknown } | { settled: "rejected"; error: any } | { settled: "pending" };

/** How `promise` ends, or "pending" if it has not by `ms` (a generous deadline, far past the bounds under test). */
async function within(promise: Promise<unknown>, ms = 5_000): Promise<Outcome> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<Outcome>((resolve) => {
    timer = setTimeout(() => resolve({ settled: "pending" }), ms);
  });
  try {
    return await Promise.race([
      promise.then(
        (value): Outcome => ({ settled: "resolved", value }),
        (error): Outcome => ({ settled: "rejected", error }),
      ),
      deadline,
    ]);
  } finally {
    clearTimeout(timer);
  }
}

const limits = (ms: Partial<{ idleMs: number; jsonMs: number }>) => ({ ...UPSTREAM_LIMITS, ...ms });

describe("a feed that says more without moving", () => {
  const stuck = (res: ServerResponse, url: URL) => {
    res.setHeader("content-type", "application/json");
    const since = Number(url.searchParams.get("since"));
    res.end(JSON.stringify({ position: since, more: true, changes: [], versions: {} }));
  };

  it("a one-shot mirror rejects it UNAVAILABLE after one request, instead of asking again for ever", async () => {
    const up = await hostile((_req, res, url) => stuck(res, url));
    const outcome = await within(mirrorDepot(createMemoryStore(), { upstream: up.url }));
    expect(outcome.settled).toBe("rejected");
    expect((outcome as { error: { code: string; message: string } }).error.code).toBe("UNAVAILABLE");
    expect((outcome as { error: { message: string } }).error.message).toMatch(/says more but moves nothing/);
    expect(up.requests()).toBe(1);
  });

  it("a following mirror rejects it too; one that says nothing new pauses between polls", async () => {
    const stuckUp = await hostile((_req, res, url) => stuck(res, url));
    const following = within(mirrorDepot(createMemoryStore(), { upstream: stuckUp.url, follow: true, intervalMs: 50 }));
    const outcome = await following;
    expect(outcome.settled).toBe("rejected");
    expect((outcome as { error: { code: string } }).error.code).toBe("UNAVAILABLE");
    expect(stuckUp.requests()).toBe(1);

    // Caught up (`more: false`, position unchanged): a poll every intervalMs, not a tight loop.
    const idle = await hostile((_req, res, url) => {
      res.setHeader("content-type", "application/json");
      res.end(
        JSON.stringify({ position: Number(url.searchParams.get("since")), more: false, changes: [], versions: {} }),
      );
    });
    const stop = new AbortController();
    const run = mirrorDepot(createMemoryStore(), {
      upstream: idle.url,
      follow: true,
      intervalMs: 200,
      signal: stop.signal,
    });
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    stop.abort();
    expect((await within(run)).settled).toBe("resolved");
    // ~5 polls in 1 s at 200 ms; a loop without the pause makes thousands.
    expect(idle.requests()).toBeGreaterThanOrEqual(1);
    expect(idle.requests()).toBeLessThan(30);
  });

  it("a feed whose pages say more while moving (with or without changes) is still walked to its end", async () => {
    const up = await hostile((_req, res, url) => {
      const since = Number(url.searchParams.get("since"));
      res.setHeader("content-type", "application/json");
      // Empty pages that advance one position each, up to 5.
      res.end(JSON.stringify({ position: since + 1, more: since + 1 < 5, changes: [], versions: {} }));
    });
    const outcome = await within(mirrorDepot(createMemoryStore(), { upstream: up.url }));
    expect(outcome).toMatchObject({ settled: "resolved", value: { position: 5 } });
    expect(up.requests()).toBe(5);
  });
});

describe("an answer whose head never comes", () => {
  it("a JSON read rejects DEADLINE_EXCEEDED within the bound (head included in jsonMs / idleMs)", async () => {
    const up = await hostile(silent);
    const upstream = new Upstream(up.url, undefined, limits({ idleMs: 300, jsonMs: 300 }));
    const outcome = await within(upstream.version("tool", "1.0.0"));
    expect(outcome.settled).toBe("rejected");
    const error = (outcome as { error: { code: string; details: Record<string, unknown> } }).error;
    expect(error.code).toBe("DEADLINE_EXCEEDED");
    expect(error.details).toMatchObject({ timeout: "head", ms: 300 });
  });

  it("the head of a JSON read is bounded by the smaller of idleMs and jsonMs", async () => {
    const up = await hostile(silent);
    const upstream = new Upstream(up.url, undefined, limits({ idleMs: 300, jsonMs: 60_000 }));
    const outcome = await within(upstream.latest("tool"));
    expect((outcome as { error: { code: string; details: unknown } }).error).toMatchObject({
      code: "DEADLINE_EXCEEDED",
      details: { timeout: "head", ms: 300 },
    });
  });

  it("a range read and a blobs read reject DEADLINE_EXCEEDED within idleMs", async () => {
    const up = await hostile(silent);
    const upstream = new Upstream(up.url, undefined, limits({ idleMs: 300, jsonMs: 60_000 }));
    const range = await within(upstream.bytes("tool", "1.0.0", 0, 10));
    expect((range as { error: { code: string } }).error.code).toBe("DEADLINE_EXCEEDED");
    const blobs = await within(upstream.blobs([{ ref: "tool@1.0.0", digest: `sha256:${"0".repeat(64)}`, size: 1 }]));
    expect((blobs as { error: { code: string } }).error.code).toBe("DEADLINE_EXCEEDED");
  });

  it("a mirror run rejects DEADLINE_EXCEEDED; the caller's signal still ends it first", async () => {
    const up = await hostile(silent);
    const bounded = await within(mirrorDepot(createMemoryStore(), { upstream: up.url, limits: { idleMs: 300 } }));
    expect((bounded as { error: { code: string } }).error.code).toBe("DEADLINE_EXCEEDED");

    // A bound far away, an abort soon: the run ends by the abort (a one-shot run returns its report).
    const stop = new AbortController();
    setTimeout(() => stop.abort(), 100);
    const aborted = await within(
      mirrorDepot(createMemoryStore(), { upstream: up.url, limits: { idleMs: 60_000 }, signal: stop.signal }),
    );
    expect(aborted).toMatchObject({ settled: "resolved", value: { position: 0 } });
  });
});

describe("a body that drips", () => {
  it("an error body dripping faster than idleMs is cut at a total bound: the status error stands", async () => {
    const up = await hostile((_req, res) => drip(res, 500, 50));
    const upstream = new Upstream(up.url, undefined, limits({ idleMs: 300, jsonMs: 60_000 }));
    const outcome = await within(upstream.version("tool", "1.0.0"));
    expect((outcome as { error: unknown }).error).toMatchObject({
      code: "UNAVAILABLE",
      details: { upstreamStatus: 500 },
    });
  });

  it("a 404 whose body drips is still a 404 (pull-through remembers it as a miss)", async () => {
    const up = await hostile((_req, res) => drip(res, 404, 50));
    const upstream = new Upstream(up.url, undefined, limits({ idleMs: 300, jsonMs: 60_000 }));
    const outcome = await within(upstream.version("tool", "1.0.0"));
    expect((outcome as { error: unknown }).error).toMatchObject({ details: { upstreamStatus: 404 } });
  });

  it("a 200 JSON body dripping faster than idleMs is cut at jsonMs, head included", async () => {
    const up = await hostile((_req, res) => {
      // The head late (within idleMs), then a drip: only the total bound can end it.
      setTimeout(() => drip(res, 200, 50), 100);
    });
    const upstream = new Upstream(up.url, undefined, limits({ idleMs: 1_000, jsonMs: 1_200 }));
    const outcome = await within(upstream.version("tool", "1.0.0"));
    expect((outcome as { error: unknown }).error).toMatchObject({
      code: "DEADLINE_EXCEEDED",
      details: { timeout: "total", ms: 1_200 },
    });
  });

  it("a manifest's range dripping faster than idleMs is cut at jsonMs (a small read is read as a JSON answer)", async () => {
    const up = await hostile((_req, res) => {
      res.writeHead(206, { "content-range": "bytes 0-511/4096", "content-length": "512" });
      res.flushHeaders();
      const timer = setInterval(() => res.write("x"), 50);
      res.on("close", () => clearInterval(timer));
    });
    const upstream = new Upstream(up.url, undefined, limits({ idleMs: 1_000, jsonMs: 600 }));
    const outcome = await within(upstream.bytes("tool", "1.0.0", 0, 512));
    expect(outcome.settled).toBe("rejected");
    expect((outcome as { error: unknown }).error).toMatchObject({
      code: "DEADLINE_EXCEEDED",
      details: { timeout: "total", ms: 600 },
    });
  });

  it("a batch feed's error body that drips is cut the same way", async () => {
    const up = await hostile((_req, res) => drip(res, 503, 50));
    const outcome = await within(mirrorDepot(createMemoryStore(), { upstream: up.url, limits: { idleMs: 300 } }));
    expect((outcome as { error: unknown }).error).toMatchObject({
      code: "UNAVAILABLE",
      details: { upstreamStatus: 503 },
    });
  });
});

describe("pull-through against a stalled upstream", () => {
  it("misses that hold every slot free them once the bound passes", async () => {
    const up = await hostile(silent);
    const local = await startDepot(createMemoryStore(), {
      upstream: { url: up.url, allowAnonymous: true, limits: { idleMs: 1_000, jsonMs: 1_000 } },
    });
    cleanups.push(() => local.close().catch(() => undefined));
    const held = [1, 2, 3, 4].map((i) => fetch(`${local.url}/version/p${i}@1.0.0`));
    // Wait until the four misses have reached the upstream: every slot is then taken.
    for (let i = 0; i < 100 && up.requests() < 4; i++) await new Promise((resolve) => setTimeout(resolve, 10));
    expect(up.requests()).toBe(4);
    const fifth = await fetch(`${local.url}/version/other@1.0.0`);
    expect(fifth.status).toBe(503);
    expect(((await fifth.json()) as { code: string }).code).toBe("TOO_MANY_PULLS");

    const ends = await Promise.all(held.map((r) => within(r)));
    for (const end of ends) {
      expect(end.settled).toBe("resolved");
      const response = (end as { value: Response }).value;
      // The upstream's timeout is an upstream outage to the reader (docs/depot-api.md): never a 404, nor a 504 of ours.
      expect(response.status).toBe(503);
      expect(response.headers.get("retry-after")).toBe("5");
      expect(((await response.json()) as { code: string }).code).toBe("UPSTREAM_UNAVAILABLE");
    }
    // The slots are free: the next miss reaches the upstream rather than TOO_MANY_PULLS.
    const next = await within(fetch(`${local.url}/version/other@1.0.0`));
    const response = (next as { value: Response }).value;
    expect(((await response.json()) as { code: string }).code).not.toBe("TOO_MANY_PULLS");
    expect(up.requests()).toBe(5);
  });
});
