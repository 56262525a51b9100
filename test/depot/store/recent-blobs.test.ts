/**
 * The recent small blobs' memory bound (review of the pg-publishes merge): what the cache holds stays within its
 * capacity counted in real memory, however small the blobs, and never a view pinning a larger buffer (Node's
 * 8 KiB pool, where pg's bytea and Buffer.concat put bodies under 4 KiB). Expiry and delete marks: fast-check
 * against a model.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { RecentBlobs } from "../../../src/depot/store/recent-blobs.js";
import { fuzzParams } from "../../fuzz/settings.js";

const digestOf = (i: number) => `sha256:${i.toString(16).padStart(64, "0")}`;

describe("RecentBlobs", () => {
  it("many one-byte blobs: a bounded number of entries, each owning exactly its bytes", () => {
    const capacity = 64 * 1024;
    const recent = new RecentBlobs(capacity, 60_000);
    for (let i = 0; i < 20_000; i++) {
      // Buffer.from under 4 KiB: a slice of the shared pool, as pg hands a small bytea.
      const pooled = Buffer.from([i & 0xff]);
      expect(pooled.buffer.byteLength).toBeGreaterThan(1);
      recent.put(digestOf(i), pooled, recent.mark());
    }
    // Each entry costs its Map slot, its digest string and its array object: far more than one byte.
    expect(recent.size).toBeLessThanOrEqual(capacity / 200);
    let held = 0;
    for (let i = 0; i < 20_000; i++) {
      const data = recent.get(digestOf(i));
      if (!data) continue;
      held++;
      expect(data[0]).toBe(i & 0xff);
      expect(data.buffer.byteLength).toBe(1);
    }
    expect(held).toBeGreaterThan(0);
  });

  it("answers what a model says: puts marked before a delete are dropped, entries past their age are gone", () => {
    const op = fc.oneof(
      fc.record({ kind: fc.constant("put" as const), key: fc.nat({ max: 5 }), size: fc.nat({ max: 3000 }) }),
      fc.record({ kind: fc.constant("stalePut" as const), key: fc.nat({ max: 5 }) }),
      fc.record({ kind: fc.constant("delete" as const), key: fc.nat({ max: 5 }) }),
      fc.record({ kind: fc.constant("tick" as const), ms: fc.nat({ max: 700 }) }),
      fc.record({ kind: fc.constant("get" as const), key: fc.nat({ max: 5 }) }),
    );
    type Op = typeof op extends fc.Arbitrary<infer T> ? T : never;
    for (const params of fuzzParams<[Op[]]>("recent blobs"))
      fc.assert(
        fc.property(fc.array(op, { maxLength: 40 }), (ops) => {
          let now = 0;
          const recent = new RecentBlobs(1 << 20, 1000, () => now);
          // The model: what may be answered (bytes and when seen); capacity is never reached here.
          const model = new Map<number, { size: number; at: number }>();
          let staleMark = recent.mark();
          for (const o of ops) {
            if (o.kind === "put") {
              if (!model.has(o.key)) model.set(o.key, { size: o.size, at: now });
              recent.put(digestOf(o.key), new Uint8Array(o.size), recent.mark());
            } else if (o.kind === "stalePut") {
              // A read that began before the last delete: its bytes may be gone.
              const before = recent.size;
              recent.put(digestOf(o.key), new Uint8Array(1), staleMark);
              if (staleMark !== recent.mark()) expect(recent.size).toBe(before);
              else if (!model.has(o.key)) model.set(o.key, { size: 1, at: now });
            } else if (o.kind === "delete") {
              recent.delete(digestOf(o.key));
              model.delete(o.key);
            } else if (o.kind === "tick") {
              now += o.ms;
              staleMark = recent.mark();
            } else {
              const want = model.get(o.key);
              const fresh = want !== undefined && now - want.at <= 1000;
              if (want && !fresh) model.delete(o.key);
              expect(recent.get(digestOf(o.key))?.byteLength).toBe(fresh ? want.size : undefined);
            }
          }
        }),
        params,
      );
  });
});
