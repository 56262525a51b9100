/** The filesystem adapters run every conformance suite, including reopen on the same directory. */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { createFsLogStore } from "../../../src/adapters/fs/index.js";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { describeJobLogStore, describePackageStore } from "../../../src/testing/index.js";

const dirs: string[] = [];
const dirOf = new WeakMap<object, string>();
async function freshDir(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "runner-depot-fs-adapter-"));
  dirs.push(dir);
  return dir;
}
afterAll(async () => {
  for (const dir of dirs) await rm(dir, { recursive: true, force: true });
});

describeJobLogStore(
  "fs",
  async () => {
    const dir = await freshDir();
    const store = createFsLogStore(dir);
    dirOf.set(store, dir);
    return store;
  },
  { reopen: (store) => createFsLogStore(dirOf.get(store)!) },
);

describePackageStore(
  "fs",
  async () => {
    const dir = await freshDir();
    const store = createFsStore(dir);
    dirOf.set(store, dir);
    return store;
  },
  { reopen: (store) => createFsStore(dirOf.get(store)!), openBlob: true },
);

describe("fs log store read index", () => {
  it("reads every window right after appends of ASCII and non-ASCII lines made once the index exists", async () => {
    const dir = await freshDir();
    const store = createFsLogStore(dir);
    const id = "7d0c3b1e-2a4f-4e8b-9c1d-5e6f7a8b9c0d";
    const expected: Array<{ line: string; stderr: boolean }> = [];
    let at = 0;
    const appendBatch = async (make: (i: number) => string) => {
      const entries = Array.from({ length: 150 }, (_, k) => {
        const line = make(at + k);
        expected.push({ line, stderr: false });
        return { stored: [{ line, stderr: false }], stderr: false, bytes: Buffer.byteLength(line) };
      });
      await store.append(id, at, entries);
      at += entries.length;
    };
    await appendBatch((i) => `ascii ${i}`);
    // A read builds the index; the appends after it keep it current without a rescan.
    expect(await store.read(id, 0, 10)).toEqual(expected.slice(0, 10));
    await appendBatch((i) => `ünïcødé ✓ 😀 ${i}`);
    await appendBatch((i) => `ascii again ${i}`);
    await appendBatch((i) => (i % 2 === 0 ? `mixed é ${i}` : `mixed ${i}`));
    for (const from of [0, 1, 255, 256, 257, 300, 511, 512, 513, 599]) {
      expect(await store.read(id, from, 40)).toEqual(expected.slice(from, from + 40));
    }
    await store.close?.();
  });
});
