/** The JobLogStore conformance cases of a cut log (runner/service/log-tail.ts): head, one marker, rolling tail. */
import { randomUUID } from "node:crypto";
import { expect, it } from "vitest";
import type { JobLogStore, LogEntry } from "../runner/ports.js";
import { logEntry } from "./helpers.js";
import { lines, type LogStoreCases } from "./log-store-cases.js";

/** Registers the cases inside describeJobLogStore's describe. */
export function describeCutLogCases<S extends JobLogStore>({ fresh, again, canReopen }: LogStoreCases<S>): void {
  it("a cut log keeps the head, one marker counting what was dropped, and a rolling tail; positions never move", async () => {
    const store = await fresh();
    const id = randomUUID();
    const text = (i: number) => `line ${String(i).padStart(5, "0")}`; // 10 bytes, 10 counted
    const head = lines(Array.from({ length: 5 }, (_, i) => text(i)));
    expect((await store.append(id, 0, head)).storedBytes).toBe(50);
    // Item 5 starts the tail (80 bytes: 8 segments of 10, one item each); items 5…104 are 100 tail lines.
    const tail = Array.from({ length: 100 }, (_, k) => logEntry(text(5 + k)));
    tail[0] = { ...tail[0]!, tailBytes: 80, capped: true };
    let at = 5;
    // Appends of several sizes: segments dropped by a later append and within one.
    for (const size of [1, 7, 2, 30, 60]) {
      await store.append(id, at, tail.slice(at - 5, at - 5 + size));
      at += size;
    }
    const state = await store.get(id);
    expect(state).toMatchObject({ committed: 105, storedLines: 106, storedBytes: 130, logTruncated: true });
    expect(state!.cut).toMatchObject({ at: 5, lines: 92, bytes: 920, tailBytes: 80 });
    expect(state!.cut!.segments[0]!.first).toBe(98);
    const all = await store.read(id);
    expect(all.map((l) => l.line)).toEqual([
      ...Array.from({ length: 5 }, (_, i) => text(i)),
      all[5]!.line,
      ...Array.from({ length: 8 }, (_, k) => text(97 + k)),
    ]);
    expect(all[5]).toMatchObject({ marker: true, skipped: 92 });
    expect(all[5]!.line).toContain("92 lines (920 bytes) dropped");
    expect(all.filter((l) => l.marker)).toHaveLength(1);
    // A read from inside the dropped range starts with the marker, standing for the rest of that range.
    const inside = await store.read(id, 50, 3);
    expect(inside[0]).toMatchObject({ marker: true, skipped: 47 });
    expect(inside.slice(1).map((l) => l.line)).toEqual([text(97), text(98)]);
    expect((await store.read(id, 100)).map((l) => l.line)).toEqual(
      [100, 101, 102, 103, 104, 105].map((p) => text(p - 1)),
    );
    expect((await store.read(id, 3, 2)).map((l) => l.line)).toEqual([text(3), text(4)]);
    expect(await store.read(id, 5, 1)).toEqual([all[5]]);
    expect(await store.read(id, 106)).toEqual([]);
    // A resend of items already stored changes nothing; the next item goes on the tail.
    await store.append(id, 100, tail.slice(95));
    const next = await store.append(id, 105, [logEntry(text(105))]);
    expect(next).toMatchObject({ committed: 106, storedLines: 107, storedBytes: 130 });
    expect(next.cut).toMatchObject({ lines: 93, bytes: 930 });
    expect((await store.read(id, 99)).map((l) => l.line)).toEqual([98, 99, 100, 101, 102, 103, 104, 105].map(text));
    if (canReopen) {
      await store.close?.();
      const other = await again(store);
      expect(await other.get(id)).toEqual(next);
      expect((await other.read(id, 99)).map((l) => l.line)).toEqual([98, 99, 100, 101, 102, 103, 104, 105].map(text));
      expect((await other.read(id, 5, 1))[0]).toMatchObject({ marker: true, skipped: 93 });
    }
  });

  it("a cut started in the middle of an append keeps the item's own line, and an item larger than the tail is kept alone", async () => {
    const store = await fresh();
    const id = randomUUID();
    const big: LogEntry = { stored: [{ line: "big", stderr: true }], stderr: true, bytes: 500 };
    const ten = (line: string): LogEntry => ({ stored: [{ line, stderr: false }], stderr: false, bytes: 10 });
    await store.append(id, 0, [logEntry("h0"), { ...ten("t0"), tailBytes: 40 }, ten("t1"), big]);
    const state = await store.get(id);
    expect(state).toMatchObject({ committed: 4, storedLines: 5 });
    expect(state!.cut).toMatchObject({ at: 1, lines: 2 });
    expect((await store.read(id)).map((l) => l.line.slice(0, 3))).toEqual(["h0", "[ru", "big"]);
    await store.append(id, 4, [logEntry("FATAL")]);
    expect((await store.read(id)).map((l) => l.line.slice(0, 5))).toEqual(["h0", "[runn", "FATAL"]);
    expect((await store.get(id))!.cut).toMatchObject({ at: 1, lines: 3, bytes: 520 });
  });
}
