/**
 * Upgrade of an fs store written with one file per record (today's layout before
 * records.db, and runner-depot 0.1.0's): its records are imported into records.db on open,
 * once across processes, resumably; every version keeps its digest; and the directory is
 * fenced so code that reads record files refuses it instead of starting an empty store.
 */
import { spawn } from "node:child_process";
import { cp, mkdir, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readLegacyRecord } from "../../../src/adapters/fs/legacy-records.js";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { openStoreFormat, STORE_FORMAT, type FormatRecord } from "../../../src/depot/store/format.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { storeDigest, startDepot, tempDir } from "../../fixtures/depot.js";

const fixture = join(import.meta.dirname, "..", "..", "fixtures", "store-0.1.0");
const worker = fileURLToPath(new URL("../../fixtures/depot-store-worker.ts", import.meta.url));
const cleanups: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const c of cleanups) await c();
});

/** Record files as the file layout named them: segments percent-encoded, the last suffixed `~`. */
function recordFile(recordsDir: string, key: string): string {
  const encode = (segment: string) => {
    if (segment === "") return "%";
    let out = "";
    for (const [i, ch] of [...segment].entries()) {
      if (/[A-Za-z0-9._@+=-]/.test(ch) && !(i === 0 && ch === ".")) out += ch;
      else for (const byte of Buffer.from(ch, "utf8")) out += `%${byte.toString(16).toUpperCase().padStart(2, "0")}`;
    }
    return out;
  };
  const segments = key.split("/").map(encode);
  return join(recordsDir, ...segments.slice(0, -1), `${segments.at(-1)}~`);
}

/**
 * Every record of `store` with its revision, but download hours (`used/<name>`, store/downloads.ts): a download
 * writes them lazily, after its answer, so when they land depends on timing, not on the import.
 */
async function dump(store: PackageStore): Promise<Map<string, { value: unknown; revision: string }>> {
  const out = new Map<string, { value: unknown; revision: string }>();
  for (const key of (await store.listRecords("", { limit: 100_000 })).keys)
    if (!key.startsWith("used/")) out.set(key, (await store.getRecord(key))!);
  return out;
}

/** A store as the file layout (format 2) left it: `records` written one file per key, plus `blobsFrom`'s blobs. */
async function writeFileLayout(
  dir: string,
  records: Map<string, { value: unknown; revision: string }>,
  blobsFrom: string,
): Promise<void> {
  await cp(join(blobsFrom, "blobs"), join(dir, "blobs"), { recursive: true });
  for (const [key, { value, revision }] of records) {
    const file = recordFile(join(dir, "records"), key);
    await mkdir(dirname(file), { recursive: true });
    await writeFile(file, JSON.stringify({ key, revision, value }));
  }
}

let today: Map<string, { value: unknown; revision: string }>;
let upgraded: string;
let expected: { versions: Record<string, { digest: string; bytes: string }> };

beforeAll(async () => {
  // A format-2 store's records, from the 0.1.0 fixture upgraded by the depot.
  const tmp = await tempDir("fs-upgrade-source-");
  cleanups.push(tmp.cleanup);
  upgraded = tmp.dir;
  await cp(join(fixture, "store"), upgraded, { recursive: true });
  const store = createFsStore(upgraded);
  await openStoreFormat(store);
  today = await dump(store);
  await store.close?.();
  expected = JSON.parse(await readFile(join(fixture, "expected.json"), "utf8")) as typeof expected;
});

describe("fs store written one file per record", () => {
  it("is imported on open: every record and revision, every version with its old digest; the fence makes file-reading code refuse the directory", async () => {
    expect((today.get("format")!.value as FormatRecord).format).toBe(STORE_FORMAT);
    const tmp = await tempDir("fs-upgrade-");
    cleanups.push(tmp.cleanup);
    await writeFileLayout(tmp.dir, today, upgraded);
    // What the file layout could also leave: a lazy create a machine crash tore (absent),
    // a lock file, a grave; and stray files whose names no key encodes to (skipped).
    const torn = recordFile(join(tmp.dir, "records"), "titem/lost/0123");
    await mkdir(dirname(torn), { recursive: true });
    await writeFile(torn, ' {"key":"titem/lo');
    await writeFile(`${recordFile(join(tmp.dir, "records"), "catalog")}.lock`, "{}");
    await mkdir(join(tmp.dir, "graves"));
    await writeFile(join(tmp.dir, "graves", "123-x"), "old");
    await writeFile(join(tmp.dir, "records", "50%~"), "{}");
    await mkdir(join(tmp.dir, "records", "%zz"));
    await writeFile(join(tmp.dir, "records", "%zz", "x~"), "{}");

    const store = createFsStore(tmp.dir);
    const depot = await startDepot(store);
    try {
      expect(await dump(store)).toEqual(today);
      expect(await store.getRecord("titem/lost/0123")).toBeNull();
      for (const [spec, { digest, bytes }] of Object.entries(expected.versions)) {
        const info = (await (await fetch(`${depot.url}/version/${spec}`)).json()) as {
          versions: Array<{ digest: string }>;
        };
        expect(info.versions[0]!.digest, spec).toBe(digest);
        const data = await fetch(`${depot.url}/data/${spec}`);
        expect(storeDigest(new Uint8Array(await data.arrayBuffer())), spec).toBe(bytes);
      }
      expect(await readdir(tmp.dir)).not.toContain("graves");
    } finally {
      await depot.close();
      await store.close?.();
    }
    // Code that reads record files (today's before records.db) reads `format` from
    // records/format~, through openStoreFormat, and refuses what it finds.
    const fileReader = {
      getRecord: async (key: string) => {
        const record = readLegacyRecord(recordFile(join(tmp.dir, "records"), key));
        return record && { value: record.value, revision: record.revision };
      },
    } as unknown as PackageStore;
    await expect(openStoreFormat(fileReader)).rejects.toMatchObject({
      code: "STORE_FORMAT_UNSUPPORTED",
      message: expect.stringContaining(`format ${STORE_FORMAT + 1}`),
    });
    // Reopened, it is not imported again (a record file changed now is ignored).
    await writeFile(
      recordFile(join(tmp.dir, "records"), "catalog"),
      JSON.stringify({ key: "catalog", revision: "hand-made", value: {} }),
    );
    const again = createFsStore(tmp.dir);
    expect(await dump(again)).toEqual(today);
    await again.close?.();
  });

  it("a new store is fenced too", async () => {
    const tmp = await tempDir("fs-upgrade-new-");
    cleanups.push(tmp.cleanup);
    const store = createFsStore(tmp.dir);
    await openStoreFormat(store);
    await store.close?.();
    const fence = readLegacyRecord(join(tmp.dir, "records", "format~"));
    expect((fence!.value as FormatRecord).format).toBeGreaterThan(STORE_FORMAT);
  });

  it("a damaged durable record file stops the import with INTERNAL, importing nothing; once repaired the import resumes", async () => {
    const tmp = await tempDir("fs-upgrade-damaged-");
    cleanups.push(tmp.cleanup);
    await writeFileLayout(tmp.dir, today, upgraded);
    const [key] = [...today.keys()].filter((k) => k.startsWith("version/"));
    const file = recordFile(join(tmp.dir, "records"), key!);
    const text = await readFile(file, "utf8");
    await writeFile(file, text.slice(0, -3));
    const store = createFsStore(tmp.dir);
    await expect(store.getRecord("format")).rejects.toMatchObject({ code: "INTERNAL" });
    await expect(store.listRecords("")).rejects.toMatchObject({ code: "INTERNAL" });
    // The fence is in place already and keeps the original `format` record for the retry.
    expect((readLegacyRecord(join(tmp.dir, "records", "format~"))!.value as FormatRecord).format).toBeGreaterThan(
      STORE_FORMAT,
    );
    await writeFile(file, text);
    expect(await dump(store)).toEqual(today);
    await store.close?.();
  });

  it("a records.db lost after the move is refused, not replaced by the old files or an empty store; a killed import still resumes", async () => {
    const tmp = await tempDir("fs-upgrade-lost-");
    cleanups.push(tmp.cleanup);
    await writeFileLayout(tmp.dir, today, upgraded);
    const lose = async () => {
      for (const name of await readdir(tmp.dir)) if (name.startsWith("records.db")) await rm(join(tmp.dir, name));
    };
    // An import that never committed (killed; here: stopped by a damaged file): the next open runs it.
    const [key] = [...today.keys()].filter((k) => k.startsWith("version/"));
    const file = recordFile(join(tmp.dir, "records"), key!);
    const text = await readFile(file, "utf8");
    await writeFile(file, "{damaged");
    let store = createFsStore(tmp.dir);
    await expect(store.getRecord("format")).rejects.toMatchObject({ code: "INTERNAL" });
    await store.close?.();
    await lose();
    await writeFile(file, text);
    store = createFsStore(tmp.dir);
    expect(await dump(store)).toEqual(today);
    const published = await store.putRecord("after/upgrade", { n: 1 }, { ifRevision: null });
    await store.close?.();
    // records.db removed after the import committed: refused, whatever the files say.
    await lose();
    store = createFsStore(tmp.dir);
    const refused = await store.getRecord("format").catch((e: unknown) => e);
    expect(refused).toMatchObject({ code: "INTERNAL" });
    expect((refused as Error).message).toMatch(/records\.db/);
    await store.close?.();
    // A new store alike: no empty store in place of a lost one.
    const fresh = await tempDir("fs-upgrade-lost-new-");
    cleanups.push(fresh.cleanup);
    store = createFsStore(fresh.dir);
    await openStoreFormat(store);
    await store.close?.();
    for (const name of await readdir(fresh.dir)) if (name.startsWith("records.db")) await rm(join(fresh.dir, name));
    store = createFsStore(fresh.dir);
    await expect(openStoreFormat(store)).rejects.toMatchObject({ code: "INTERNAL" });
    await store.close?.();
    expect(published).not.toBeNull();
  });

  it("is imported once when several processes open it at the same time", async () => {
    const tmp = await tempDir("fs-upgrade-mp-");
    cleanups.push(tmp.cleanup);
    await writeFileLayout(tmp.dir, today, upgraded);
    const runs = await Promise.all(
      [1, 2, 3].map(
        (n) =>
          new Promise<number | null>((resolve) => {
            const child = spawn(process.execPath, ["--import", "tsx", worker, tmp.dir, "cas", `opened/${n}`, "3"], {
              stdio: ["ignore", "ignore", "inherit"],
            });
            child.on("exit", resolve);
          }),
      ),
    );
    expect(runs).toEqual([0, 0, 0]);
    const store = createFsStore(tmp.dir);
    const records = await dump(store);
    for (const n of [1, 2, 3]) expect((records.get(`opened/${n}`)!.value as { n: number }).n).toBe(3);
    for (const n of [1, 2, 3]) records.delete(`opened/${n}`);
    expect(records).toEqual(today);
    await store.close?.();
  });
});
