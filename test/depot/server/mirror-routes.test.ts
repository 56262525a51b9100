/**
 * The mirror's batch reads on a real server (fs store, bearer tokens): `GET /mirror/feed` details only the versions the
 * token may read; `POST /mirror/blobs` answers the exact bytes of blobs that are items of readable versions, and
 * refuses a digest a version does not hold, a package the token may not read, and bodies out of bounds.
 */
import { createHash } from "node:crypto";
import { gunzipSync } from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { bearerTokens } from "../../../src/depot/server/auth.js";
import { publish, startDepot, tempDir, type LiveDepot } from "../../fixtures/depot.js";

const cleanups: Array<() => Promise<unknown>> = [];
let depot: LiveDepot;
const all = { Authorization: "Bearer all" };
const some = { Authorization: "Bearer some" };
const digestOf = (text: string) => `sha256:${createHash("sha256").update(text).digest("hex")}`;

beforeAll(async () => {
  const tmp = await tempDir("mirror-routes-");
  cleanups.push(tmp.cleanup);
  const store = createFsStore(tmp.dir, { unsafeNoSync: true });
  cleanups.push(async () => store.close?.());
  depot = await startDepot(store, { authorize: bearerTokens({ all: ["*"], some: { read: ["open-*"] } }) });
  cleanups.push(() => depot.close());
  for (const [spec, body] of [
    ["open-a@1.0.0", "open bytes"],
    ["secret@1.0.0", "secret bytes"],
  ])
    expect((await publish(depot.url, spec, [{ type: "file", path: "f", body }], all)).status).toBe(201);
});
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

const blobs = (headers: Record<string, string>, body: unknown) =>
  fetch(`${depot.url}/mirror/blobs`, {
    method: "POST",
    headers: { ...headers, "Content-Type": "application/json" },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });

describe("mirror batch routes", () => {
  it("details only readable versions, gzip-compressed, with each manifest's exact text", async () => {
    const raw = await fetch(`${depot.url}/mirror/feed?since=0`, { headers: { ...some, "Accept-Encoding": "gzip" } });
    expect(raw.status).toBe(200);
    const page = (await raw.json()) as {
      position: number;
      more: boolean;
      changes: Array<{ name: string }>;
      versions: Record<string, { digest: string; size: number; manifest: string }>;
    };
    expect(page.changes.map((c) => c.name)).toEqual(["open-a", "secret"]);
    expect(Object.keys(page.versions)).toEqual(["open-a@1.0.0"]);
    const manifest = JSON.parse(page.versions["open-a@1.0.0"]!.manifest) as { items: Array<{ digest: string }> };
    expect(manifest.items[0]!.digest).toBe(digestOf("open bytes"));
    expect(page).toMatchObject({ position: 2, more: false });
    // Compressed on the wire when asked (node's fetch decodes it above).
    const { request } = await import("node:http");
    const encoding = await new Promise<string | undefined>((resolve, reject) =>
      request(`${depot.url}/mirror/feed?since=0`, { headers: { ...some, "accept-encoding": "gzip" } }, (res) => {
        const parts: Buffer[] = [];
        res.on("data", (c: Buffer) => parts.push(c));
        res.on("end", () => {
          expect(JSON.parse(gunzipSync(Buffer.concat(parts)).toString()).position).toBe(2);
          resolve(res.headers["content-encoding"]);
        });
      })
        .on("error", reject)
        .end(),
    );
    expect(encoding).toBe("gzip");
  });

  it("answers the exact bytes of readable items in order, and refuses anything else", async () => {
    const ok = await blobs(some, { blobs: [["open-a@1.0.0", digestOf("open bytes")]] });
    expect(ok.status).toBe(200);
    expect(Buffer.from(await ok.arrayBuffer()).toString()).toBe("open bytes");
    const both = await blobs(all, {
      blobs: [
        ["secret@1.0.0", digestOf("secret bytes")],
        ["open-a@1.0.0", digestOf("open bytes")],
      ],
    });
    expect(Buffer.from(await both.arrayBuffer()).toString()).toBe("secret bytesopen bytes");
    // Not readable with this token; a digest the version does not hold; malformed and oversized bodies.
    expect((await blobs(some, { blobs: [["secret@1.0.0", digestOf("secret bytes")]] })).status).toBe(403);
    expect((await blobs(all, { blobs: [["open-a@1.0.0", digestOf("secret bytes")]] })).status).toBe(409);
    expect((await blobs(all, { blobs: [] })).status).toBe(400);
    expect((await blobs(all, "not json")).status).toBe(400);
    expect((await blobs(all, { blobs: [["open-a@1.0.0", "sha256:zz"]] })).status).toBe(400);
    expect((await blobs(all, { blobs: Array(1001).fill(["open-a@1.0.0", digestOf("open bytes")]) })).status).toBe(400);
    expect((await blobs(all, "x".repeat(300 * 1024))).status).toBe(413);
    expect((await blobs({}, { blobs: [["open-a@1.0.0", digestOf("open bytes")]] })).status).toBe(401);
  });
});
