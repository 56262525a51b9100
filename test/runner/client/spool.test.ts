/**
 * The runner client's spool (src/runner/client/spool.ts) against a model, an array of frames: every
 * method (append, appendLines, appendRuns, frameStart, drop, truncate, slice, frames, has, start/end/bytes) after any sequence of
 * the others (appendRuns too: a run's lines are items of one frame, and a call starts at a run's first line), and
 * the slices already handed to a call never changing while any of their items is
 * held (they may be in flight when the spool is truncated and appended to again; a dropped chunk's
 * memory is reused, so a fully dropped slice may change). Session 9 made the spool a
 * class; this checks the whole behaviour, not only the paths the example tests take. It fails
 * with truncate's chunk left unsealed, with its bytes not subtracted, or with drop keeping a
 * fully acknowledged chunk.
 */
import { randomUUID } from "node:crypto";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { fromBinary } from "@bufbuild/protobuf";
import { RUN_LINES, createSpool } from "../../../src/runner/client/spool.js";
import { appendLine, framesALine, resplitFrom } from "../../../src/runner/client/spool-items.js";
import { createLogItemEncoder } from "../../../src/runner/protocol/encoder.js";
import { LogItemSchema } from "../../../src/gen/runner/v1/runner_pb.js";

type Op =
  | { k: "append"; size: number }
  | { k: "lines"; sizes: number[]; max: number }
  | { k: "runs"; sizes: number[]; max: number; maxFrame: number }
  | { k: "drop"; at: number }
  | { k: "truncate"; at: number; stored: number }
  | { k: "slice"; at: number; max: number }
  | { k: "frames"; at: number };

// A line's frame in this model: its length byte, its bytes, then the tail. A run's frame is a real LogItem with this
// ID, ended by the same tail (stderr: LogRun field 2).
const framer = {
  head: (n: number) => Uint8Array.of(n),
  tail: Uint8Array.of(0x10, 0x01),
  id: Uint8Array.of(0x0a, 0x01, 0x41),
};

/** The lines of a run frame written with {@link framer}, read back by protobuf-es. */
function runLines(frame: Buffer): string[] {
  expect(frame[0]).toBe(0);
  expect(frame.readUInt32BE(1)).toBe(frame.length - 5);
  const item = fromBinary(LogItemSchema, frame.subarray(5));
  expect(item.requestId).toBe("A");
  if (item.event.case !== "run") throw new Error(`not a run: ${item.event.case}`);
  expect(item.event.value.stderr).toBe(true);
  return item.event.value.lines;
}

describe("spool: a property against a model", () => {
  it("behaves as a list of frames (one item each, or a run's lines) in every method, and never changes a slice it handed out", () => {
    const sizes = fc.array(fc.nat(40), { maxLength: 8 });
    const op = fc.oneof(
      { arbitrary: fc.record({ k: fc.constant("append" as const), size: fc.integer({ min: 1, max: 90 }) }), weight: 5 },
      {
        arbitrary: fc.record({ k: fc.constant("lines" as const), sizes, max: fc.integer({ min: 0, max: 50 }) }),
        weight: 2,
      },
      {
        arbitrary: fc.record({
          k: fc.constant("runs" as const),
          sizes,
          max: fc.integer({ min: 0, max: 50 }),
          // The cap on a run's frame (the client's line limit): one line alone may pass it.
          maxFrame: fc.integer({ min: 8, max: 200 }),
        }),
        weight: 3,
      },
      fc.record({ k: fc.constant("drop" as const), at: fc.nat(60) }),
      // `stored`: a re-split from inside a run, whose lines before the spool's start the server holds already.
      fc.record({ k: fc.constant("truncate" as const), at: fc.nat(60), stored: fc.nat(1) }),
      fc.record({ k: fc.constant("slice" as const), at: fc.nat(60), max: fc.integer({ min: 1, max: 300 }) }),
      fc.record({ k: fc.constant("frames" as const), at: fc.nat(60) }),
    );
    fc.assert(
      fc.property(
        fc.integer({ min: 8, max: 128 }),
        fc.nat(5),
        fc.array(op, { maxLength: 80 }),
        // A chunk's index of item ends starts this small and doubles (reused with the chunk's memory).
        fc.integer({ min: 1, max: 4 }),
        (chunkBytes, start0, ops, endsAtFirst) => {
          const spool = createSpool({ chunkBytes, start: start0, endsAtFirst });
          let start = start0;
          let stamp = 0;
          // The frames in order, each with its first item's offset and its items (1, or a run's lines).
          const frames: { at: number; n: number; bytes: Buffer }[] = [];
          let endAt = start0;
          const end = () => endAt;
          const push = (bytes: Buffer, n: number) => {
            frames.push({ at: endAt, n, bytes });
            endAt += n;
          };
          /** The index of the frame holding item `o`, or frames.length past the end. */
          const frameOf = (o: number) => {
            const k = frames.findIndex((f) => o < f.at + f.n);
            return k === -1 ? frames.length : k;
          };
          const concat = (from: number, to: number) =>
            Buffer.concat(frames.filter((f) => f.at >= from && f.at < to).map((f) => f.bytes));
          // Slices handed to a call, checked while none of their items is dropped (a drop follows a call's close,
          // so no write of a dropped item is in flight, and a fully dropped chunk's memory is reused).
          let inFlight: { at: number; bufs: Buffer[]; copy: Buffer }[] = [];
          for (const raw of ops) {
            // Offsets relative to what is held (one below start to two past end), so most ops hit it.
            const o =
              raw.k === "append" || raw.k === "lines" || raw.k === "runs"
                ? raw
                : { ...raw, at: Math.max(0, start - 1 + (raw.at % (end() - start + 4))) };
            if (o.k === "append") {
              const b = Buffer.alloc(o.size, ++stamp % 251);
              const off = spool.append(b.length, (buf, pos) => pos + b.copy(buf, pos));
              expect(off).toBe(end());
              push(b, 1);
            } else if (o.k === "lines" || o.k === "runs") {
              // Lines behind and before bytes that are no line; each its own frame, or in runs.
              const lines = o.sizes.map((n) => Buffer.alloc(n, 0x61 + (++stamp % 26)));
              const src = Buffer.concat([
                Buffer.from("xx"),
                ...lines.flatMap((l) => [l, Buffer.from("\n")]),
                Buffer.from("yy"),
              ]);
              const taken = lines.findIndex((l) => l.length > o.max);
              const want = taken === -1 ? lines : lines.slice(0, taken);
              const before = end();
              const next =
                o.k === "lines"
                  ? spool.appendLines(src, 2, src.length - 2, o.max, framer)
                  : spool.appendRuns(src, 2, src.length - 2, o.max, framer, o.maxFrame);
              expect(next).toBe(2 + want.reduce((n, l) => n + l.length + 1, 0));
              expect(spool.end).toBe(before + want.length);
              if (o.k === "lines") {
                for (const l of want) push(Buffer.concat([Buffer.from([l.length]), l, Buffer.from(framer.tail)]), 1);
              } else {
                // How the spool cut the lines into runs is its own (chunk room); every line is there once, in order.
                const made = spool.frames(before);
                expect(made.flatMap((f) => runLines(f))).toEqual(want.map((l) => l.toString()));
                for (const f of made) {
                  const n = runLines(f).length;
                  if (n > 1) expect(f.length).toBeLessThanOrEqual(o.maxFrame);
                  push(Buffer.from(f), n);
                }
              }
            } else if (o.k === "drop") {
              spool.drop(o.at);
              if (o.at > start) start = Math.min(o.at, end());
            } else if (o.k === "truncate") {
              // The caller cuts at a frame's first item (frameStart); with `stored`, the cut items up to `next` are
              // stored already and the spool numbers on from there.
              const at = Math.max(o.at, start);
              const k = frameOf(at);
              const to = k < frames.length ? frames[k]!.at : end();
              expect(spool.frameStart(at)).toBe(at >= end() ? at : to);
              // A re-split from inside a run: the run's lines from its start to the spool's start (runner-committed)
              // are stored; the client passes that start as `next`.
              const next = o.stored > 0 && start > to ? start : to;
              spool.truncate(to, next);
              if (to < end()) {
                frames.length = k;
                endAt = Math.max(to, next);
                start = next > to ? Math.max(start, next) : Math.min(start, to);
              }
            } else if (o.k === "slice") {
              if (o.at >= end() || o.at < start) {
                if (o.at >= end()) expect(spool.slice(o.at, o.max)).toEqual({ buffers: [], bytes: 0, to: o.at });
              } else {
                // A call starts at the first line of the run holding its offset.
                const from = frames[frameOf(o.at)]!.at;
                expect(spool.frameStart(o.at)).toBe(from);
                const s = spool.slice(from, o.max);
                expect(s.to).toBeGreaterThan(from);
                expect(frames.some((f) => f.at === s.to) || s.to === end()).toBe(true);
                const want = concat(from, s.to);
                expect(Buffer.concat(s.buffers)).toEqual(want);
                expect(s.bytes).toBe(want.length);
                if (frameOf(s.to - 1) > frameOf(from)) expect(s.bytes).toBeLessThanOrEqual(o.max);
                if (s.to < end()) expect(s.bytes + frames[frameOf(s.to)]!.bytes.length).toBeGreaterThan(o.max);
                inFlight.push({ at: from, bufs: s.buffers, copy: Buffer.from(want) });
              }
            } else {
              const fr = spool.frames(o.at);
              const k = frameOf(Math.max(o.at, start));
              expect(fr.map((b) => b.toString("hex"))).toEqual(frames.slice(k).map((f) => f.bytes.toString("hex")));
            }
            expect(spool.start).toBe(start);
            expect(spool.end).toBe(end());
            const heldSize = frames.filter((f) => f.at + f.n > start).reduce((n, f) => n + f.bytes.length, 0);
            expect(spool.bytes).toBeGreaterThanOrEqual(heldSize);
            // Whole chunks are held, so items before start may count, but never a truncated one.
            expect(spool.bytes).toBeLessThanOrEqual(frames.reduce((n, f) => n + f.bytes.length, 0));
            if (start === end() && o.k === "drop" && o.at >= start) expect(spool.bytes).toBe(0);
            for (let x = start - 1; x <= end() + 1; x++) expect(spool.has(x)).toBe(x >= start && x <= end());
            inFlight = inFlight.filter((f) => f.at >= start);
            for (const f of inFlight) expect(Buffer.concat(f.bufs)).toEqual(f.copy);
          }
        },
      ),
      { numRuns: 3000 },
    );
  });

  it("cuts runs at 4,096 lines, at the frame cap, and where a chunk has under 1 KiB left", () => {
    // 5,000 empty lines: two runs, 4,096 and 904 lines.
    const spool = createSpool();
    const empty = Buffer.alloc(5000, 0x0a);
    expect(spool.appendRuns(empty, 0, empty.length, 100, framer, 65_536)).toBe(5000);
    expect(spool.frames(0).map((f) => runLines(f).length)).toEqual([RUN_LINES, 5000 - RUN_LINES]);
    // 1,000 lines of 20 bytes (22 a field) under a 1,000-byte cap: runs of at most 1,000 bytes a frame.
    const capped = createSpool();
    const lines = Buffer.from(`${"y".repeat(20)}\n`.repeat(1000));
    capped.appendRuns(lines, 0, lines.length, 100, framer, 1000);
    const frames = capped.frames(0);
    expect(frames.every((f) => f.length <= 1000)).toBe(true);
    expect(frames.flatMap((f) => runLines(f))).toHaveLength(1000);
    expect(frames.length).toBeLessThan(30);
    // A chunk of 4 KiB with 600 bytes left: the next run starts a chunk of its own rather than a run of a few lines.
    const room = createSpool({ chunkBytes: 4096 });
    room.append(3496, (buf, pos) => {
      buf.fill(0, pos, pos + 3496);
      return pos + 3496;
    });
    const run = Buffer.from(`${"z".repeat(50)}\n`.repeat(20));
    room.appendRuns(run, 0, run.length, 100, framer, 65_536);
    const after = room.frames(1);
    expect(after).toHaveLength(1);
    expect(runLines(after[0]!)).toHaveLength(20);
    expect(room.slice(0, 1 << 20).buffers).toHaveLength(2);
  });

  it("turns runs into frames a line as sent, from any item on, without changing an offset", () => {
    // Pipe reads of random lines (ASCII, multi-byte, empty), each in runs or a frame a line; then every item from a
    // random one on, as a server without runs gets it: a frame a line, the same lines, streams and times, in order.
    const read = fc.record({
      lines: fc.array(fc.string({ unit: fc.constantFrom("a", "é", "😀", " "), maxLength: 40 }), {
        minLength: 1,
        maxLength: 60,
      }),
      runs: fc.boolean(),
      stderr: fc.boolean(),
      time: fc.integer({ min: 1, max: 2_000_000_000_000 }),
    });
    fc.assert(
      fc.property(
        fc.array(read, { minLength: 1, maxLength: 8 }),
        fc.nat(),
        fc.integer({ min: 64, max: 4096 }),
        (reads, at, budget) => {
          const enc = createLogItemEncoder(randomUUID());
          const spool = createSpool({ chunkBytes: 1024 });
          const want: { line: string; stderr: boolean; time: number }[] = [];
          for (const r of reads) {
            const bytes = Buffer.from(r.lines.map((l) => `${l}\n`).join(""));
            if (r.runs) spool.appendRuns(bytes, 0, bytes.length, 1000, enc.lineFramer(r.stderr, r.time), 512);
            else for (const l of r.lines) appendLine(spool, enc, l, r.stderr, r.time);
            for (const line of r.lines) want.push({ line, stderr: r.stderr, time: r.time });
          }
          expect(spool.end).toBe(want.length);
          const from = at % want.length;
          const got: typeof want = [];
          for (let sent = from; sent < spool.end;) {
            const start = spool.frameStart(sent);
            const slice = spool.slice(start, budget);
            expect(slice.to).toBeGreaterThan(sent);
            const out = framesALine(slice.buffers, start, sent, enc);
            expect(out.bytes).toBe(out.buffers.reduce((n, b) => n + b.length, 0));
            const body = Buffer.concat(out.buffers);
            for (let p = 0; p < body.length;) {
              const len = body.readUInt32BE(p + 1);
              const event = fromBinary(LogItemSchema, body.subarray(p + 5, p + 5 + len)).event;
              if (event.case !== "log") throw new Error(`not a line: ${event.case}`);
              got.push({
                line: event.value.line,
                stderr: event.value.stderr,
                time: Number(event.value.timeUnixNano / 1_000_000n),
              });
              p += 5 + len;
            }
            sent = slice.to;
          }
          expect(got).toEqual(want.slice(from).map((w) => ({ ...w, time: Math.floor(w.time) })));
        },
      ),
      { numRuns: 300 },
    );
  });

  it("re-splits from inside a run: the run's lines before runner-committed are not numbered again", () => {
    // One run of 10 lines of 100 bytes; 4 are stored. Cut to 60 bytes a line, lines 4–9 become 12 items from 4 on.
    const enc = createLogItemEncoder(randomUUID());
    const spool = createSpool();
    const lines = Array.from({ length: 10 }, (_, i) => `${i}`.padEnd(100, "q"));
    const read = Buffer.from(lines.map((l) => `${l}\n`).join(""));
    spool.appendRuns(read, 0, read.length, 1000, enc.lineFramer(true, 1_700_000_000_000), 65_536);
    spool.drop(4);
    expect(spool.frameStart(4)).toBe(0);
    const { boundary } = resplitFrom(spool, enc, 4, 60, [5, 10]);
    expect(spool.start).toBe(4);
    expect(spool.end).toBe(16);
    const items = spool.frames(4).map((f) => fromBinary(LogItemSchema, f.subarray(5)).event);
    expect(items.map((e) => (e.case === "log" ? e.value.line : e.case))).toEqual(
      lines.slice(4).flatMap((l) => [l.slice(0, 60), l.slice(60)]),
    );
    expect(items.every((e) => e.case === "log" && e.value.stderr && e.value.timeUnixNano > 0n)).toBe(true);
    // end() waiting for item 10 (the last line) now waits for 16.
    expect(boundary.get(10)).toBe(16);
    expect(boundary.get(5)).toBe(6);
    // Only the boundaries asked for are kept (a map of every one grew with the spool's lines).
    expect([...boundary.keys()].sort()).toEqual([10, 5]);
  });

  it("re-splits runs into runs when runs are on: the spool does not grow a frame a line", () => {
    const enc = createLogItemEncoder(randomUUID());
    const spool = createSpool();
    const lines = Array.from({ length: 10 }, (_, i) => `${i}`.padEnd(1500, "q"));
    const read = Buffer.from(lines.map((l) => `${l}\n`).join(""));
    spool.appendRuns(read, 0, read.length, 4000, enc.lineFramer(true, 1_700_000_000_000), 65_536);
    const empties = Buffer.alloc(10_000, 0x0a);
    spool.appendRuns(empties, 0, empties.length, 4000, enc.lineFramer(false, 1_700_000_000_001), 65_536);
    spool.drop(4);
    const before = spool.bytes;
    // The client's smallest halved limit (1 KiB): lines 4–9 cut in two (12 items), then the 10,000 empty lines.
    const { boundary } = resplitFrom(spool, enc, 4, 1024, [5, 10, 10_010], true);
    expect(spool.end).toBe(4 + 12 + 10_000);
    const frames = spool.frames(4).map((f) => fromBinary(LogItemSchema, f.subarray(5)).event);
    expect(frames.every((e) => e.case === "run")).toBe(true);
    const got = frames.flatMap((e) => (e.case === "run" ? e.value.lines.map((l) => [l, e.value.stderr]) : []));
    expect(got).toEqual([
      ...lines.slice(4).flatMap((l) => [
        [l.slice(0, 1024), true],
        [l.slice(1024), true],
      ]),
      ...Array.from({ length: 10_000 }, () => ["", false]),
    ]);
    expect(boundary.get(5)).toBe(6);
    expect(boundary.get(10)).toBe(16);
    expect(boundary.get(10_010)).toBe(10_016);
    // ~2 bytes an empty line, as before (runs of at most 1 KiB: a few frames more); a frame a line, ~500 KB.
    expect(spool.bytes).toBeLessThan(before + 10_000);
  });

  it("appendLines after a truncate writes nothing into the cut chunk, whose bytes may be in flight", () => {
    const spool = createSpool({ chunkBytes: 4096 });
    const run = (fill: number, lines: number) =>
      Buffer.concat(Array.from({ length: lines }, () => Buffer.concat([Buffer.alloc(40, fill), Buffer.from("\n")])));
    const first = run(0x61, 10);
    expect(spool.appendLines(first, 0, first.length, 1000, framer)).toBe(first.length);
    // A call is writing items 0–9; the call fails and the client cuts items 4–9 off to encode them again.
    const inFlight = spool.slice(0, 1 << 20);
    const copy = Buffer.from(Buffer.concat(inFlight.buffers));
    spool.truncate(4);
    const second = run(0x62, 10);
    expect(spool.appendLines(second, 0, second.length, 1000, framer)).toBe(second.length);
    expect(Buffer.concat(inFlight.buffers)).toEqual(copy);
    expect(spool.end).toBe(14);
    expect(Buffer.concat(spool.frames(4))).toEqual(
      Buffer.concat(
        Array.from({ length: 10 }, () =>
          Buffer.concat([Buffer.of(40), Buffer.alloc(40, 0x62), Buffer.from(framer.tail)]),
        ),
      ),
    );
  });

  it("grows a chunk's index of item ends, and reuses the grown one with the chunk's memory", () => {
    // Index of 2 at first: 300 tiny frames in one chunk grow it to 512; a release hands it to the next chunk.
    const spool = createSpool({ chunkBytes: 4096, endsAtFirst: 2 });
    const frame = (n: number) => (buf: Buffer, pos: number) => {
      buf[pos] = n & 0xff;
      buf[pos + 1] = n >> 8;
      return pos + 2;
    };
    const expected = (from: number, to: number) =>
      Buffer.concat(Array.from({ length: to - from }, (_, k) => Buffer.from([(from + k) & 0xff, (from + k) >> 8])));
    for (let i = 0; i < 300; i++) spool.append(2, frame(i));
    expect(Buffer.concat(spool.frames(0))).toEqual(expected(0, 300));
    expect(spool.frames(0).map((f) => f.length)).toEqual(Array(300).fill(2));
    spool.drop(300);
    // The same memory, and the grown index with stale ends past the new count: never read.
    for (let i = 300; i < 450; i++) spool.append(2, frame(i));
    expect(spool.frames(300).map((f) => f.length)).toEqual(Array(150).fill(2));
    expect(Buffer.concat(spool.frames(300))).toEqual(expected(300, 450));
    const slice = spool.slice(310, 21);
    expect(slice.to).toBe(320);
    expect(Buffer.concat(slice.buffers)).toEqual(expected(310, 320));
    // An index of 0 would never grow: it is taken as 1.
    const tiny = createSpool({ chunkBytes: 4096, endsAtFirst: 0 });
    for (let i = 0; i < 5; i++) tiny.append(2, frame(i));
    expect(Buffer.concat(tiny.frames(0))).toEqual(expected(0, 5));
  });

  it("writes later items into a released chunk's memory, never into a sealed one's", () => {
    // Chunks of 256 KiB, far above any Buffer pool (Node 24 pools 8 KiB allocations that Node 22 did not), so each
    // has its own memory; frames of 64 KiB, four to a chunk.
    const chunkBytes = 256 * 1024;
    const F = 64 * 1024;
    const frame = (n: number) => (buf: Buffer, pos: number) => {
      buf.fill(n, pos, pos + F);
      return pos + F;
    };
    const memoryOf = (spool: ReturnType<typeof createSpool>, at: number) => spool.slice(at, 1).buffers[0]!.buffer;

    // Released: items 0–3 fill chunk A, 4 starts chunk B; an Ack of 4 releases A; the next chunk takes A's memory.
    const spool = createSpool({ chunkBytes });
    for (let i = 0; i < 5; i++) spool.append(F, frame(i));
    const a = memoryOf(spool, 0);
    expect(memoryOf(spool, 4)).not.toBe(a);
    spool.drop(4);
    for (let i = 5; i < 9; i++) spool.append(F, frame(i));
    expect(memoryOf(spool, 8)).toBe(a);
    expect(Buffer.concat(spool.frames(4))).toEqual(Buffer.concat([4, 5, 6, 7, 8].map((n) => Buffer.alloc(F, n))));

    // Sealed: a truncate cuts items off chunk C (their bytes may be in flight); once C is released it is not reused.
    const sealed = createSpool({ chunkBytes });
    for (let i = 0; i < 4; i++) sealed.append(F, frame(i));
    const c = memoryOf(sealed, 0);
    sealed.truncate(2);
    sealed.drop(2);
    for (let i = 2; i < 10; i++) sealed.append(F, frame(i + 100));
    for (let at = 2; at < 10; at++) expect(memoryOf(sealed, at)).not.toBe(c);
  });
});
