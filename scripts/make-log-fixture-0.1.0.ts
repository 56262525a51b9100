/**
 * Writes test/fixtures/logs-0.1.0/: job logs as runner-depot 0.1.0 stored them, before per-line times (run once,
 * with that version's code: an fs log store's records without times, and a version 1 archive object), plus
 * expected.json with the lines each holds, so the tests of newer code read real old data. Kept for the record;
 * running it with newer code writes the newer formats.
 */
import { rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { createFsLogArchive, createFsLogStore } from "../src/adapters/fs/index.js";
import { createArchivingLogStore } from "../src/runner/index.js";
import type { JobResult, LogEntry, StoredLine } from "../src/runner/ports.js";

const out = process.argv[2] ?? join(import.meta.dirname, "..", "test", "fixtures", "logs-0.1.0");
await rm(out, { recursive: true, force: true });

const lines: StoredLine[] = [
  { line: "hello from 0.1.0", stderr: false },
  { line: "an error line ✓", stderr: true },
  { line: "x".repeat(40), stderr: false },
  { line: "[runner-depot] line truncated: 100 bytes, kept 40", stderr: false, marker: true },
  { line: "", stderr: false },
  { line: '"quoted" \\ tab\t', stderr: false },
];
const entries: LogEntry[] = [
  { stored: [lines[0]!], stderr: false, bytes: Buffer.byteLength(lines[0]!.line) },
  { stored: [lines[1]!], stderr: true, bytes: Buffer.byteLength(lines[1]!.line) },
  { stored: [lines[2]!, lines[3]!], stderr: false, bytes: 40 },
  { stored: [lines[4]!], stderr: false, bytes: 0 },
  { stored: [lines[5]!], stderr: false, bytes: Buffer.byteLength(lines[5]!.line) },
];
const at = new Date("2026-11-20T10:00:00Z");
function result(requestId: string): JobResult {
  return {
    requestId,
    outcome: "finished",
    exitCode: 0,
    success: true,
    repoUrl: "",
    commitSha: "",
    lines: { stdout: 4, stderr: 1 },
    logTruncated: false,
    startedAt: at.toISOString(),
    endedAt: new Date(at.getTime() + 60_000).toISOString(),
  };
}

// A job that stays in the fs store, and one moved to an fs archive.
const liveId = "00000000-0000-4000-8000-000000000001";
const archivedId = "00000000-0000-4000-8000-000000000002";
const live = createFsLogStore(join(out, "live"));
await live.append(liveId, 0, entries, at);
await live.finish(liveId, result(liveId), { at: entries.length });
await live.close?.();

const archived = createArchivingLogStore(createFsLogStore(join(out, "archived-live")), {
  archive: createFsLogArchive(join(out, "archive")),
  keepLiveMs: 0,
});
await archived.append(archivedId, 0, entries, at);
await archived.finish(archivedId, result(archivedId), { at: entries.length });
await archived.archiveJob(archivedId);
await archived.close();

await writeFile(join(out, "expected.json"), JSON.stringify({ liveId, archivedId, lines }, null, 2) + "\n");
console.log(`wrote ${out}`);
