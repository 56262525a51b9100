/**
 * follow() fan-out across two replicas on one PostgreSQL: 1,000 followers on 100 live
 * jobs, half on each replica, the jobs streamed over gRPC into replica A. Replica B's
 * followers get every line although its poll is set to 10 minutes (so the lines can only
 * have come through LISTEN/NOTIFY), each replica holds one LISTEN connection, and B reads
 * the store once per change of a job, not once per follower.
 */
import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { createPostgresLogStore } from "../../../src/adapters/postgres/index.js";
import { createRunnerService, startRunnerServer } from "../../../src/runner/index.js";
import { createRunnerClient } from "../../../src/runner/client/runner-client.js";
import { channelOf } from "../../../src/adapters/postgres/log-notify.js";
import { countingChanges, countingReads, drainLines } from "../../fixtures/log-reads.js";
import { listeningSessions } from "../../fixtures/pg-listen.js";
import { createTestSchema, needs } from "../../fixtures/backends.js";

needs("postgres");

const JOBS = 100;
const FOLLOWERS_PER_JOB = 10;
const LINES = 60;

describe("follow() fan-out across two replicas on PostgreSQL", () => {
  it("1,000 followers on 100 jobs: a line stored through replica A reaches followers on replica B through NOTIFY; one LISTEN connection per replica", async () => {
    const db = await createTestSchema();
    const a = countingChanges(createPostgresLogStore({ pool: db.pool, schema: db.schema }));
    const b = countingReads(createPostgresLogStore({ pool: db.pool, schema: db.schema }));
    // Polls so rare that only events can deliver within the test.
    const replicaA = createRunnerService(createMemoryQueue(), { logs: a.store, follow: { pollMs: 600_000 } });
    const replicaB = createRunnerService(createMemoryQueue(), { logs: b.store, follow: { pollMs: 600_000 } });
    const serverA = await startRunnerServer(replicaA, { port: 0 });
    const jobs = Array.from({ length: JOBS }, () => randomUUID());
    try {
      // Registered first, so followers find the jobs and wait at their (empty) live end.
      for (const id of jobs) await replicaA.expectJob(id);
      const followers = jobs.flatMap((id) =>
        Array.from({ length: FOLLOWERS_PER_JOB }, (_, k) => ({
          id,
          onB: k % 2 === 1,
          lines: drainLines((k % 2 === 1 ? replicaB : replicaA).follow(id)),
        })),
      );
      // Both replicas LISTEN (B's followers subscribed it; A's too), one session each.
      expect(await listeningSessions(db.pool, channelOf(db.schema), 2)).toBe(2);

      await Promise.all(
        jobs.map(async (id, j) => {
          const client = createRunnerClient({ endpoint: serverA.url, requestId: id });
          try {
            for (let i = 0; i < LINES; i++) {
              client.log(`job ${j} line ${i}`, i % 3 === 0);
              // Several appends per job, so followers wake more than once.
              if (i % 20 === 19) await client.flush();
            }
            await client.end({ exitCode: 0, success: true });
          } finally {
            await client.close();
          }
        }),
      );
      const results = await Promise.all(followers.map((f) => f.lines));
      results.forEach((lines, i) => {
        const j = jobs.indexOf(followers[i]!.id);
        expect(lines).toEqual(Array.from({ length: LINES }, (_, k) => `job ${j} line ${k}`));
      });
      // Replica B's 500 followers cost a read per change of a job (an append or the end, however
      // the client batched its lines), shared; a follower that starts while its job's shared read is
      // in flight may read once for itself (under load they start spread out), and a job's last read
      // finds its end. Without the fan-out each follower would read for itself: at least 500 × 3.
      const onB = (JOBS * FOLLOWERS_PER_JOB) / 2;
      console.log(`replica B: ${b.reads()} store reads for ${onB} followers, ${a.changes()} changes`);
      expect(b.reads()).toBeLessThanOrEqual(a.changes() + onB + JOBS);
      expect(b.reads()).toBeLessThan(onB * 3);
      expect(followers.filter((f) => f.onB)).toHaveLength((JOBS * FOLLOWERS_PER_JOB) / 2);
    } finally {
      await serverA.close();
      await replicaA.close();
      await replicaB.close();
      await a.store.close?.();
      await b.store.close?.();
      await db.drop();
    }
  });
});
