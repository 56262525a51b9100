/** The conformance suite of the JobResultQueue port. */
import { afterEach, describe, expect, it } from "vitest";
import { only, skipped } from "./register.js";
import { RunnerDepotError } from "../errors.js";
import type { JobResult, JobResultQueue } from "../runner/ports.js";
import { delay, sampleJobResult } from "./helpers.js";

/** A message as it reached the backend, read through the suite's back door. */
export interface ConsumedMessage {
  body: JobResult;
  messageId?: string;
  contentType?: string;
  type?: string;
  persistent?: boolean;
}

/** A way to take the backend down and bring it back (for outage cases). */
export interface BackendOutage<A> {
  /** Makes the backend of `adapter` unreachable (stop a broker, cut a proxy …); resolves once it is. */
  break(adapter: A): void | Promise<void>;
  /** Brings it back; resolves once it accepts connections again. */
  heal(adapter: A): void | Promise<void>;
  /** An adapter configured to give up quickly during an outage (short publish timeout). */
  impatient?: () => A | Promise<A>;
  /**
   * The adapter itself retries through an outage (default true). When false (the
   * memory queue), a publish during an outage must reject with UNAVAILABLE at once.
   */
  retries?: boolean;
}

/** Options of {@link describeQueueAdapter}. */
export interface QueueAdapterSuiteOptions<Q extends JobResultQueue = JobResultQueue> {
  /**
   * Back door: the messages that reached the backend from this adapter since the last
   * call (draining). Without it the suite only checks that publishes resolve.
   */
  consume?: (queue: Q) => Promise<ConsumedMessage[]> | ConsumedMessage[];
  /** The back door reports message properties (messageId, contentType, type, persistent). */
  properties?: boolean;
  /** Backend failure cases, when the backend can be broken from the test. */
  outage?: BackendOutage<Q>;
  /** Publishes in the concurrency case; default 200. */
  concurrency?: number;
}

/**
 * Registers the JobResultQueue conformance suite (vitest) for an adapter.
 *
 * @example
 * describeQueueAdapter("memory", () => createMemoryQueue(), {
 *   consume: (q) => q.results.splice(0).map((body) => ({ body })),
 * });
 */
export function describeQueueAdapter<Q extends JobResultQueue>(
  name: string,
  factory: () => Q | Promise<Q>,
  options: QueueAdapterSuiteOptions<Q> = {},
): void {
  describe(`JobResultQueue conformance: ${name}`, () => {
    const open: Q[] = [];
    const received = new Map<Q, ConsumedMessage[]>();

    async function fresh(make: () => Q | Promise<Q> = factory): Promise<Q> {
      const queue = await make();
      open.push(queue);
      received.set(queue, []);
      return queue;
    }

    afterEach(async () => {
      for (const queue of open.splice(0)) await queue.close?.();
    });

    /** Reads the back door until `enough` holds (delivery may lag a confirm a little). */
    async function readUntil(queue: Q, enough: (all: ConsumedMessage[]) => boolean): Promise<ConsumedMessage[]> {
      const all = received.get(queue)!;
      for (let i = 0; i < 200; i++) {
        all.push(...(await options.consume!(queue)));
        if (enough(all)) break;
        await delay(25);
      }
      return all;
    }

    const withConsume = options.consume ? it : skipped;

    it("publish resolves, and close twice is harmless", async () => {
      const queue = await fresh();
      await expect(queue.publishJobResult(sampleJobResult())).resolves.toBeUndefined();
      await queue.close?.();
      await queue.close?.();
    });

    withConsume("the published result reaches the backend unchanged", async () => {
      const queue = await fresh();
      const result = sampleJobResult({
        repoUrl: "https://git.example.com/ünïcødé/✓.git",
        lines: { stdout: 1200, stderr: 14 },
      });
      await queue.publishJobResult(result);
      const all = await readUntil(queue, (m) => m.some((x) => x.body.requestId === result.requestId));
      const mine = all.filter((m) => m.body.requestId === result.requestId);
      expect(mine).toHaveLength(1);
      expect(mine[0]!.body).toEqual(result);
    });

    only(options.consume && options.properties)(
      "messages carry messageId, content type, type and persistence",
      async () => {
        const queue = await fresh();
        const result = sampleJobResult();
        await queue.publishJobResult(result);
        const all = await readUntil(queue, (m) => m.some((x) => x.body.requestId === result.requestId));
        expect(all.find((m) => m.body.requestId === result.requestId)).toMatchObject({
          messageId: result.requestId,
          contentType: "application/json",
          type: "runner.v1.JobResult",
          persistent: true,
        });
      },
    );

    withConsume("every outcome round-trips, including null startedAt", async () => {
      const queue = await fresh();
      const results = [
        sampleJobResult({ outcome: "lost", exitCode: -1, success: false, startedAt: null, repoUrl: "", commitSha: "" }),
        sampleJobResult({ outcome: "cancelled", exitCode: -1, success: false }),
        sampleJobResult({ outcome: "finished", exitCode: 3, success: true, logTruncated: true }),
      ];
      for (const r of results) await queue.publishJobResult(r);
      const all = await readUntil(queue, (m) => m.length >= 3);
      for (const r of results) expect(all.find((m) => m.body.requestId === r.requestId)?.body).toEqual(r);
    });

    it("many concurrent publishes all resolve" + (options.consume ? " and all arrive" : ""), async () => {
      const queue = await fresh();
      const n = options.concurrency ?? 200;
      const results = Array.from({ length: n }, () => sampleJobResult());
      await Promise.all(results.map((r) => queue.publishJobResult(r)));
      if (!options.consume) return;
      const ids = new Set(results.map((r) => r.requestId));
      const all = await readUntil(queue, (m) => new Set(m.map((x) => x.body.requestId)).size >= n);
      const got = new Set(all.map((m) => m.body.requestId).filter((id) => ids.has(id)));
      expect(got.size).toBe(n);
    });

    withConsume(
      "a duplicate publish resolves; both copies arrive, identical, with the same messageId (consumers dedupe)",
      async () => {
        const queue = await fresh();
        const result = sampleJobResult();
        await queue.publishJobResult(result);
        await queue.publishJobResult(result);
        // The queue is a transport, not a deduplicator: what the service publishes twice arrives twice.
        const all = await readUntil(queue, (m) => m.filter((x) => x.body.requestId === result.requestId).length >= 2);
        const copies = all.filter((m) => m.body.requestId === result.requestId);
        expect(copies).toHaveLength(2);
        for (const copy of copies) expect(copy.body).toEqual(result);
        if (options.properties) expect(new Set(copies.map((c) => c.messageId))).toEqual(new Set([result.requestId]));
      },
    );

    const outage = options.outage;
    if (outage)
      describe("backend outage", () => {
        const broken = new Set<Q>();
        async function breakIt(queue: Q): Promise<void> {
          broken.add(queue);
          await outage!.break(queue);
        }
        async function healIt(queue: Q): Promise<void> {
          broken.delete(queue);
          await outage!.heal(queue);
        }
        afterEach(async () => {
          for (const queue of [...broken]) await healIt(queue);
        });

        only(!(outage?.retries === false))(
          "a publish during an outage waits, retries and resolves once the backend is back",
          async () => {
            const queue = await fresh();
            await queue.publishJobResult(sampleJobResult()); // connected before the outage
            await breakIt(queue);
            const result = sampleJobResult();
            const pending = queue.publishJobResult(result);
            let settled = false;
            pending.then(
              () => (settled = true),
              () => (settled = true),
            );
            await delay(200);
            expect(settled).toBe(false);
            await healIt(queue);
            await expect(pending).resolves.toBeUndefined();
            if (options.consume) {
              const all = await readUntil(queue, (m) => m.some((x) => x.body.requestId === result.requestId));
              expect(all.filter((m) => m.body.requestId === result.requestId).length).toBeGreaterThanOrEqual(1);
            }
            // And the adapter keeps working afterwards.
            await expect(queue.publishJobResult(sampleJobResult())).resolves.toBeUndefined();
          },
        );

        only(outage?.impatient || outage?.retries === false)(
          "a publish the backend never accepts rejects with UNAVAILABLE; the adapter recovers",
          async () => {
            const queue = await fresh(outage!.impatient ?? factory);
            await breakIt(queue);
            const lost = sampleJobResult();
            const error = await queue.publishJobResult(lost).then(
              () => null,
              (e: unknown) => e,
            );
            expect(error).toBeInstanceOf(RunnerDepotError);
            expect((error as RunnerDepotError).code).toBe("UNAVAILABLE");
            await healIt(queue);
            const after = sampleJobResult();
            await expect(queue.publishJobResult(after)).resolves.toBeUndefined();
            if (options.consume) {
              const all = await readUntil(queue, (m) => m.some((x) => x.body.requestId === after.requestId));
              expect(all.some((m) => m.body.requestId === after.requestId)).toBe(true);
            }
          },
        );
      });
  });
}
