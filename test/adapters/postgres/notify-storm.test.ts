/**
 * A forged NOTIFY storm on the PostgreSQL log store's change channel (attack review:
 * any role that can connect may NOTIFY on it). Replica B follows a job that replica A
 * streams over gRPC; meanwhile four other sessions send 3,000 well-formed but false events
 * for that job one statement each, so they arrive spread out (huge line counts, ends that
 * did not happen). B's store reads are counted
 * through a wrapping store: events wake the job's followers at most once per
 * `follow.eventIntervalMs`, so the reads stay bounded by the storm's duration, not by the
 * number of notifications; the real lines still reach every follower, in order.
 */
import { randomUUID } from "node:crypto";
import pg from "pg";
import { describe, expect, it } from "vitest";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { createPostgresLogStore } from "../../../src/adapters/postgres/index.js";
import { channelOf } from "../../../src/adapters/postgres/log-notify.js";
import { createRunnerClient } from "../../../src/runner/client/runner-client.js";
import {
  createRunnerService,
  startRunnerServer,
  type RunnerServer,
  type RunnerService,
} from "../../../src/runner/index.js";
import { countingReads, drainLines } from "../../fixtures/log-reads.js";
import { listeningSessions } from "../../fixtures/pg-listen.js";
import { createTestSchema, needs, POSTGRES_URL } from "../../fixtures/backends.js";

needs("postgres");

const FOLLOWERS = 10;
const INTERVAL_MS = 200;
const FORGERS = 4;
const PER_FORGER = 750;
const EVENTS = FORGERS * PER_FORGER;
const LINES = 100;

describe("follow() under a forged NOTIFY storm (PostgreSQL log store)", () => {
  it(`${EVENTS} forged events cost reads bounded by time / eventIntervalMs; real lines still arrive`, async () => {
    const db = await createTestSchema();
    const a = createPostgresLogStore({ pool: db.pool, schema: db.schema });
    const b = countingReads(createPostgresLogStore({ pool: db.pool, schema: db.schema }), { countGet: true });
    const forgers = Array.from({ length: FORGERS }, () => new pg.Client({ connectionString: POSTGRES_URL }));
    for (const forger of forgers) forger.on("error", () => {});
    const stop = new AbortController();
    // Nothing below may wait past the watchdog: it aborts the followers, and every wait is
    // raced against the abort, so the finally block always runs and closes everything.
    const watchdog = setTimeout(() => stop.abort(new Error("watchdog: the storm test took over 90 s")), 90_000);
    const aborted = new Promise<never>((_, reject) =>
      stop.signal.addEventListener("abort", () => reject(stop.signal.reason as Error), { once: true }),
    );
    aborted.catch(() => {});
    const bounded = <T>(work: Promise<T>): Promise<T> => Promise.race([work, aborted]);
    let replicaA: RunnerService | undefined;
    let replicaB: RunnerService | undefined;
    let serverA: RunnerServer | undefined;
    let followers: Array<Promise<string[]>> = [];
    let client: ReturnType<typeof createRunnerClient> | undefined;
    try {
      await bounded(Promise.all(forgers.map((forger) => forger.connect())));
      // Polls so rare that only events (and the fills they cause) read the store on B.
      replicaA = createRunnerService(createMemoryQueue(), { logs: a });
      replicaB = createRunnerService(createMemoryQueue(), {
        logs: b.store,
        follow: { pollMs: 600_000, eventIntervalMs: INTERVAL_MS },
      });
      serverA = await startRunnerServer(replicaA, { port: 0 });
      const id = randomUUID();
      await replicaA.expectJob(id);
      const rb = replicaB;
      followers = Array.from({ length: FOLLOWERS }, () => drainLines(rb.follow(id, { signal: stop.signal })));
      // B LISTENs once its followers subscribed it (A LISTENs only when followed: it is not).
      const channel = channelOf(db.schema);
      expect(await listeningSessions(db.pool, channel, 1)).toBeGreaterThanOrEqual(1);

      const c = createRunnerClient({ endpoint: serverA.url, requestId: id });
      client = c;
      const writer = (async () => {
        try {
          for (let i = 0; i < LINES; i++) {
            c.log(`line ${i}`);
            if (i % 10 === 9) {
              await c.flush();
              await new Promise((r) => setTimeout(r, 50));
            }
          }
        } catch (error) {
          await c.close();
          throw error;
        }
      })();

      const before = b.reads();
      const started = performance.now();
      // Well-formed payloads: counts far past the end, ends that never happened, small counts;
      // one statement each, one after another on each session (pg deprecates overlapping
      // queries on a client), the sessions at once, so they arrive one by one.
      await bounded(
        Promise.all(
          forgers.map(async (forger, f) => {
            for (let k = 0; k < PER_FORGER; k++) {
              const n = f * PER_FORGER + k;
              const payload = k % 3 === 0 ? `${1e12 + n} 0 ${id}` : k % 3 === 1 ? `${n} 1 ${id}` : `${k} 0 ${id}`;
              await forger.query(`SELECT pg_notify($1, $2)`, [channel, payload]);
            }
          }),
        ),
      );
      // Let the last notifications be delivered and their held events applied.
      await new Promise((r) => setTimeout(r, 2 * INTERVAL_MS));
      const elapsed = performance.now() - started;
      const stormReads = b.reads() - before;

      await bounded(writer);
      await bounded(c.end({ exitCode: 0, success: true }));
      await bounded(c.close());
      const lines = await bounded(Promise.all(followers));
      const expected = Array.from({ length: LINES }, (_, i) => `line ${i}`);
      for (const got of lines) expect(got).toEqual(expected);

      // One wake per interval at most. Beyond the page reads that find real lines (at most one
      // per append of the writer: LINES / 10), a wake costs a state read (a forged end), a page
      // read that finds nothing where a forged count said lines were, and the state read after it.
      const wakes = Math.ceil(elapsed / INTERVAL_MS) + 1;
      // The design's cost is 3 reads a wake; the check allows 5: loaded runs came within 2
      // of the exact figure (80 for 82) but one at load 16 took 102 against a bound of 4 a
      // wake (94). What it is about is one wake per interval, not the reads a wake makes:
      // without the limit the storm costs a read per event (641), several times this bound
      // even for a storm a loaded machine stretches to seconds.
      const bound = 5 * wakes + LINES / 10;
      console.log(
        `${EVENTS} forged events in ${Math.round(elapsed)} ms: ${stormReads} store reads on replica B (bound ${bound})`,
      );
      // The bound follows the storm's measured length: a loaded machine stretches the storm and
      // so allows more wakes (a fixed EVENTS / 20 failed once at load 23 with 167 reads for 3,000
      // events). Without the rate limit the same storm costs a read per event (641 seen here).
      expect(stormReads).toBeLessThanOrEqual(bound);
    } finally {
      clearTimeout(watchdog);
      stop.abort();
      await Promise.allSettled(followers);
      await client?.close().catch(() => {});
      await serverA?.close();
      await replicaA?.close();
      await replicaB?.close();
      await Promise.all(forgers.map((forger) => forger.end().catch(() => {})));
      await a.close?.();
      await b.store.close?.();
      await db.drop();
    }
  }, 120_000);
});
