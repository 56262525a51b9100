/** The JobLogStore conformance cases of log sections (runner/service/log-sections.ts): formats, bounds, replicas. */
import { randomUUID } from "node:crypto";
import { expect, it } from "vitest";
import type { JobLogStore, LogEntry } from "../runner/ports.js";
import { sampleJobResult } from "./helpers.js";
import { lines, type LogStoreCases } from "./log-store-cases.js";

/** Registers the cases inside describeJobLogStore's describe. */
export function describeSectionCases<S extends JobLogStore>({ fresh, again, withReopen }: LogStoreCases<S>): void {
  it("sections: GitLab and GitHub markers, nesting, times, odd names, unmatched ends, still open at the end", async () => {
    const store = await fresh();
    if (!store.sections) return;
    const id = randomUUID();
    expect(await store.sections(id)).toBeNull();
    await store.open(id);
    expect(await store.sections(id)).toEqual({ sections: [], dropped: 0, unmatched: 0 });
    const odd = "naïve step/✓ «x» 🚀";
    const timed = (line: string, time: number): LogEntry => ({
      stored: [{ line, stderr: false, time }],
      stderr: false,
      bytes: line.length,
    });
    // Split over three appends; the third overlaps the second (its first item is not folded twice).
    await store.append(id, 0, [
      timed("\x1b[0Ksection_start:1700000000:outer[collapsed=true]\r\x1b[0KOuter", 1),
      timed("one", 2),
      timed(`::group::${odd}`, 1_700_000_001_500),
      timed("two", 3),
    ]);
    await store.append(id, 4, [
      timed("::endgroup::", 1_700_000_004_000),
      timed("\x1b[0Ksection_end:1700000009:nope\r\x1b[0K", 5),
    ]);
    await store.append(id, 5, [
      timed("\x1b[0Ksection_end:1700000009:nope\r\x1b[0K", 5),
      timed("\x1b[0Ksection_end:1700000010:outer\r\x1b[0K", 6),
      timed("section_start:1700000011:tail", 7),
      timed("still going", 8),
    ]);
    await store.finish(id, sampleJobResult({ requestId: id, exitCode: 1, success: false }), { at: 9 });
    const got = await store.sections(id);
    expect(got).toEqual({
      sections: [
        {
          name: "outer",
          format: "gitlab",
          start: 0,
          end: 6,
          depth: 0,
          startTime: 1_700_000_000_000,
          endTime: 1_700_000_010_000,
          collapsed: true,
        },
        {
          name: odd,
          format: "github",
          start: 2,
          end: 4,
          depth: 1,
          startTime: 1_700_000_001_500,
          endTime: 1_700_000_004_000,
          collapsed: true,
        },
        {
          name: "tail",
          format: "gitlab",
          start: 7,
          end: null,
          depth: 0,
          startTime: 1_700_000_011_000,
          endTime: null,
          collapsed: false,
        },
      ],
      dropped: 0,
      unmatched: 1,
    });
    // A copy: changing it changes nothing stored.
    got!.sections.length = 0;
    expect((await store.sections(id))!.sections).toHaveLength(3);
  });

  it("sections are bounded: at most 1000 a job and 16 deep, names cut to 256 bytes", async () => {
    const store = await fresh();
    if (!store.sections) return;
    const id = randomUUID();
    const deep = Array.from({ length: 20 }, (_, i) => `section_start:1700000000:d${i}`);
    const many = Array.from({ length: 1200 }, (_, i) => (i % 2 === 0 ? `::group::g${i}` : "::endgroup::"));
    await store.append(id, 0, lines([...deep, `section_start:1:${"é".repeat(300)}`]));
    await store.append(
      id,
      21,
      lines([`section_end:2:${"é".repeat(300)}`, ...deep.map((l) => l.replace("start", "end")).reverse()]),
    );
    await store.append(id, 42, lines(many));
    await store.append(id, 1242, lines(many));
    const got = (await store.sections(id))!;
    expect(got.sections).toHaveLength(1000);
    expect(got.sections.filter((s) => s.name.startsWith("d")).map((s) => s.depth)).toEqual(
      Array.from({ length: 16 }, (_, i) => i),
    );
    // 4 too deep, the long name too (its end is then unmatched, as are the 4 too deep), and 200 past the count.
    expect(got.dropped).toBe(5 + (1200 - (1000 - 16)));
    expect(got.sections.every((s) => Buffer.byteLength(s.name) <= 256)).toBe(true);
    expect(got.sections.slice(0, 16).every((s) => s.end === 21 + 1 + 19 - s.depth)).toBe(true);
  });

  withReopen("sections survive a reopen, agree between replicas, and stay when the lines are archived", async () => {
    const store = await fresh();
    if (!store.sections) return;
    const other = await again(store);
    const id = randomUUID();
    // Replicas take turns, each append holding markers.
    await store.append(id, 0, lines(["::group::a", "x"]));
    await other.append(id, 2, lines(["::endgroup::", "::group::b"]));
    await store.append(id, 4, lines(["::group::c", "::endgroup::"]));
    await other.append(id, 6, lines(["::endgroup::"]));
    const want = {
      sections: [
        { name: "a", format: "github", start: 0, end: 2, depth: 0, startTime: 0, endTime: 0, collapsed: true },
        { name: "b", format: "github", start: 3, end: 6, depth: 0, startTime: 0, endTime: 0, collapsed: true },
        { name: "c", format: "github", start: 4, end: 5, depth: 1, startTime: 0, endTime: 0, collapsed: true },
      ],
      dropped: 0,
      unmatched: 0,
    };
    expect(await store.sections(id)).toEqual(want);
    expect(await other.sections!(id)).toEqual(want);
    await store.finish(id, sampleJobResult({ requestId: id }), { at: 7 });
    if (store.markArchived) {
      const at = new Date().toISOString();
      await store.markArchived(id, { lines: 7, bytes: 1, chunks: 1, rawBytes: 1, at });
      expect(await store.sections(id)).toEqual(want);
    }
    await store.close?.();
    expect(await (await again(store)).sections!(id)).toEqual(want);
  });
}
