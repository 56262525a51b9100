/** The filesystem adapters run every conformance suite, including reopen on the same directory. */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll } from "vitest";
import { createFsLogStore } from "../src/adapters/fs/index.js";
import { createFsStore } from "../src/adapters/fs/store.js";
import { describeJobLogStore, describePackageStore } from "../src/testing/index.js";

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
