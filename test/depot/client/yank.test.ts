/**
 * DepotClient's yank and un-yank against a real depot (fs store, loopback socket): the mark is set and taken back,
 * `depends()` and `download()` surface `Pkg-Yanked`'s reason decoded, `versions()` lists it; bad input is refused
 * before a request.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import { isRunnerDepotError } from "../../../src/errors.js";
import { startDepot, tempDir, type LiveDepot } from "../../fixtures/depot.js";

let depot: LiveDepot;
const cleanups: Array<() => Promise<unknown>> = [];
beforeAll(async () => {
  const tmp = await tempDir("client-yank-");
  cleanups.push(tmp.cleanup);
  const store = createFsStore(tmp.dir, { unsafeNoSync: true });
  cleanups.push(async () => store.close?.());
  depot = await startDepot(store);
  cleanups.push(() => depot.close());
});
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

describe("DepotClient yank", () => {
  it("yanks with a reason, surfaces it on depends, download and versions, and un-yanks", async () => {
    const client = createDepotClient({ baseUrl: depot.url });
    for (const version of ["1.0.0", "1.1.0"])
      await client.publish({ name: "yk", version, items: [{ type: "file", path: "f", content: version }] });
    const reason = "breaks TLS on arm64 — see #12, 100% sure";
    expect(await client.yank("yk@1.1.0", reason)).toEqual({ name: "yk", version: "1.1.0", yanked: reason });
    expect((await client.depends("yk@1.1.0")).yanked).toBe(reason);
    expect((await client.depends("yk@1.0.0")).yanked).toBeUndefined();
    // The unversioned read resolves past the yanked version.
    expect((await client.depends("yk")).version).toBe("1.0.0");
    const chunks: Uint8Array[] = [];
    const sink = new WritableStream<Uint8Array>({ write: (c) => void chunks.push(c) });
    expect((await client.download("yk@1.1.0", { to: sink })).yanked).toBe(reason);
    const info = await client.versions("yk");
    expect(info.latest).toBe("1.0.0");
    expect(info.versions.find((v) => v.version === "1.1.0")?.yanked?.reason).toBe(reason);

    expect(await client.unyank("yk@1.1.0")).toEqual({ name: "yk", version: "1.1.0", yanked: null });
    expect((await client.depends("yk@1.1.0")).yanked).toBeUndefined();
    expect((await client.versions("yk")).latest).toBe("1.1.0");
  });

  it("refuses a yank without a version or with a bad reason before sending, and a missing version after", async () => {
    const client = createDepotClient({ baseUrl: depot.url });
    const codeOf = (p: Promise<unknown>) =>
      p.then(
        () => "resolved",
        (e: unknown) => isRunnerDepotError(e) && e.code,
      );
    expect(await codeOf(client.yank("yk", "why"))).toBe("VERSION_INVALID");
    expect(await codeOf(client.yank("yk@1.0.0", "   "))).toBe("BAD_REQUEST");
    expect(await codeOf(client.yank("yk@1.0.0", "a\nb"))).toBe("BAD_REQUEST");
    expect(await codeOf(client.yank("yk@9.9.9", "gone"))).toBe("VERSION_NOT_FOUND");
  });
});
