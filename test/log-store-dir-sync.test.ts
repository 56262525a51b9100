/**
 * The fs log store's directory fsyncs as a runner sees them, over a real HTTP/2 server and
 * gRPC client (session 9 review): a filesystem that cannot fsync a directory (EINVAL) still
 * takes lines; a disk that fails the fsync (EIO) fails the call, which acknowledges nothing.
 */
import { randomUUID } from "node:crypto";
import { mkdtempSync, readlinkSync, rmSync } from "node:fs";
import { open } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { createFsLogStore } from "../src/adapters/fs/index.js";
import { line, send, startHarness, storedTexts } from "./runner-service-helpers.js";

const root = mkdtempSync(join(tmpdir(), "runner-depot-dir-sync-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** Makes every directory fsync (FileHandle#sync: the log and state files use fd calls) fail with `code` while `failing()`; returns the undo. */
async function failDirSync(code: string, failing: () => boolean): Promise<() => void> {
  const probe = await open(root, "r");
  const proto = Object.getPrototypeOf(probe) as { sync: () => Promise<void> };
  await probe.close();
  const original = proto.sync;
  proto.sync = function (this: { fd: number }) {
    if (!failing()) return original.call(this);
    return Promise.reject(Object.assign(new Error(`${code}: injected, fsync ${readlinkSync(`/proc/self/fd/${this.fd}`)}`), { code, syscall: "fsync" }));
  };
  return () => {
    proto.sync = original;
  };
}

describe("fs log store directory fsyncs over the wire (session 9 review)", () => {
  it("EIO: the call fails and its committed count stays; once the disk works the lines are taken", async () => {
    const harness = await startHarness({ logs: createFsLogStore(join(root, "eio")) });
    const id = randomUUID();
    let failing = false;
    const undo = await failDirSync("EIO", () => failing);
    try {
      expect(await send(harness.client, [line(id, "a"), line(id, "b")])).toMatchObject({ ok: true, committed: "2" });
      failing = true;
      const failed = await send(harness.client, [line(id, "c")], { offset: 2 });
      // INTERNAL, with the count the server holds durably: the two lines before.
      expect(failed).toMatchObject({ ok: null, code: "Internal", committed: "2" });
      expect((await harness.logs.get(id))?.committed).toBe(2);
      failing = false;
      expect(await send(harness.client, [line(id, "c")], { offset: 2 })).toMatchObject({ ok: true, committed: "3" });
      expect(await storedTexts(harness.logs, id)).toEqual(["a", "b", "c"]);
    } finally {
      undo();
      await harness.close();
    }
  });

  it("EINVAL (a filesystem that cannot fsync a directory): calls succeed and every line is stored", async () => {
    const dir = join(root, "einval");
    const harness = await startHarness({ logs: createFsLogStore(dir) });
    const id = randomUUID();
    const undo = await failDirSync("EINVAL", () => true);
    try {
      expect(await send(harness.client, [line(id, "a"), line(id, "b")])).toMatchObject({ ok: true, committed: "2" });
      expect(await send(harness.client, [line(id, "c")], { offset: 2 })).toMatchObject({ ok: true, committed: "3" });
      expect(await storedTexts(harness.logs, id)).toEqual(["a", "b", "c"]);
    } finally {
      undo();
      await harness.close();
    }
  });
});
