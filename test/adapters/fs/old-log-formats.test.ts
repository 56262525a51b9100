/**
 * Logs stored before per-line times (test/fixtures/logs-0.1.0, written by 0.1.0's code with
 * scripts/make-log-fixture-0.1.0.ts) read with today's code: the fs store's records and a
 * version 1 archive object give back every line, without a time; the same store then keeps
 * times (and sections) for new jobs beside them.
 */
import { cpSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { createFsLogArchive, createFsLogStore } from "../../../src/adapters/fs/index.js";
import { createArchivingLogStore } from "../../../src/runner/index.js";
import type { StoredLine } from "../../../src/runner/ports.js";

const FIXTURE = join(import.meta.dirname, "..", "..", "fixtures", "logs-0.1.0");
const expected = JSON.parse(readFileSync(join(FIXTURE, "expected.json"), "utf8")) as {
  liveId: string;
  archivedId: string;
  lines: StoredLine[];
};
// A copy: opening a store may write to it.
const dir = mkdtempSync(join(tmpdir(), "runner-depot-old-logs-"));
cpSync(FIXTURE, dir, { recursive: true });
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("job logs stored by 0.1.0", () => {
  it("the fs store reads its old records as lines without times, and keeps times for a new job beside them", async () => {
    const store = createFsLogStore(join(dir, "live"));
    try {
      expect(await store.read(expected.liveId)).toEqual(expected.lines);
      expect(await store.read(expected.liveId, 3, 2)).toEqual(expected.lines.slice(3, 5));
      const id = "00000000-0000-4000-8000-0000000000aa";
      const time = Date.parse("2026-11-29T09:00:00Z") + 0.001;
      await store.append(id, 0, [{ stored: [{ line: "new", stderr: false, time }], stderr: false, bytes: 3 }]);
      expect(await store.read(id)).toEqual([{ line: "new", stderr: false, time }]);
      expect(await store.read(expected.liveId)).toEqual(expected.lines);
      // A state file from before sections reads as having none (its log is not re-scanned); a new job gets them.
      expect(await store.sections!(expected.liveId)).toEqual({ sections: [], dropped: 0, unmatched: 0 });
      await store.append(id, 1, [{ stored: [{ line: "::group::g", stderr: false, time }], stderr: false, bytes: 10 }]);
      expect((await store.sections!(id))!.sections.map((s) => s.name)).toEqual(["g"]);
    } finally {
      await store.close?.();
    }
  });

  it("a version 1 archive object (RDLOGAR1) reads back every line, without times", async () => {
    expect(
      readFileSync(join(dir, "archive", `${expected.archivedId}.rdlog`))
        .subarray(-32, -24)
        .toString(),
    ).toBe("RDLOGAR1");
    const logs = createArchivingLogStore(createFsLogStore(join(dir, "archived-live")), {
      archive: createFsLogArchive(join(dir, "archive")),
      keepLiveMs: 0,
    });
    try {
      expect((await logs.get(expected.archivedId))?.archived).toBeTruthy();
      expect(await logs.read(expected.archivedId)).toEqual(expected.lines);
      expect(await logs.read(expected.archivedId, 4)).toEqual(expected.lines.slice(4));
    } finally {
      await logs.close();
    }
  });
});
