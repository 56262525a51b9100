/**
 * A hostile depot (node:http on 127.0.0.1) holding the installer's CPU (issue 30, item 5):
 * a conflicting package with 20,000 versions, whose error the resolver rebuilt at every
 * step (about 15 minutes to maxSteps), and an archive of 1,000 files 1,000 directories deep,
 * whose every parent was checked again for every file (quadratic in depth). Both now finish
 * in seconds; the tests carry a 60 s timeout, which the code before the fix overran
 * (measured: ~15 min and ~150 s; see RELIABILITY.md).
 */
import { createHash } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { readdir } from "node:fs/promises";
import path from "node:path";
import tar from "tar-stream";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import { tempDir } from "../../fixtures/depot.js";
import { failure } from "../../fixtures/errors.js";

let tmp: Awaited<ReturnType<typeof tempDir>>;
let server: Server | undefined;
beforeEach(async () => {
  tmp = await tempDir("depot-hostile-cpu-");
});
afterEach(async () => {
  server?.closeAllConnections();
  await new Promise((r) => (server ? server.close(r) : r(null)));
  server = undefined;
  await tmp.cleanup();
});

type Versions = Record<string, Array<{ version: string; requires: Array<{ name: string; range: string }> }>>;

/** A depot serving `/version`, `/depend` from `packages`, and `/data/evil@1.0.0` as `archive`. */
async function depot(packages: Versions, archive?: Buffer): Promise<string> {
  server = createServer((req, res) => {
    const json = (body: unknown) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify(body));
    };
    const url = decodeURIComponent(req.url ?? "");
    const version = /^\/version\/([^/]+)$/.exec(url);
    if (version && packages[version[1]!]) {
      const list = packages[version[1]!]!;
      const size = archive?.length ?? 1;
      const digest = `sha256:${createHash("sha256")
        .update(archive ?? "")
        .digest("hex")}`;
      return json({
        name: version[1],
        latest: list.at(-1)!.version,
        versions: list.map((v) => ({
          version: v.version,
          publishedAt: "",
          digest,
          size,
          itemCount: 0,
          attributes: {},
        })),
      });
    }
    const depend = /^\/depend\/([^@]+)@(.+)$/.exec(url);
    if (depend) {
      const v = packages[depend[1]!]?.find((x) => x.version === depend[2]);
      if (v) return json({ name: depend[1], version: v.version, requires: v.requires });
    }
    if (url === "/data/evil@1.0.0" && archive) {
      res.writeHead(200, {
        "content-type": "application/x-tar",
        "content-length": String(archive.length),
        "repr-digest": `sha-256=:${createHash("sha256").update(archive).digest("base64")}:`,
      });
      return res.end(archive);
    }
    res.writeHead(404, { "content-type": "application/problem+json" });
    res.end(JSON.stringify({ code: "NOT_FOUND", status: 404, detail: url }));
  });
  // Kept alive through the old resolver's long pauses (a socket closed meanwhile fails the next request).
  server.keepAliveTimeout = 120_000;
  await new Promise<void>((r) => server!.listen(0, "127.0.0.1", r));
  return `http://127.0.0.1:${(server!.address() as AddressInfo).port}`;
}

describe("a hostile depot cannot hold the installer's CPU (issue 30, item 5)", () => {
  it(
    "a conflict against a package of 20,000 versions gives up at maxSteps in seconds",
    { timeout: 60_000 },
    async () => {
      const lib = Array.from({ length: 20_000 }, (_, i) => ({ version: `1.0.${i}`, requires: [] }));
      const tool = Array.from({ length: 100 }, (_, i) => ({
        version: `1.${i}.0`,
        requires: [{ name: "lib", range: "^2" }],
      }));
      const app = [
        {
          version: "1.0.0",
          requires: [
            { name: "lib", range: "^1" },
            { name: "tool", range: "*" },
          ],
        },
      ];
      const url = await depot({ app, lib, tool });
      const error = await failure(createDepotClient({ baseUrl: url }).install("app", path.join(tmp.dir, "t")));
      // Every tool wants lib@^2 where app holds lib@^1: 10,000 candidates tried, the first conflict reported.
      expect(error.code).toBe("DEPENDENCY_CONFLICT");
      expect(error.message).toMatch(/^no single version of lib satisfies \^1 \(required by app@1\.0\.0\) and \^2/);
      expect((error.details.available as string[]).length).toBe(20_000);
    },
  );

  it(
    "an archive of 1,000 files 1,000 directories deep installs in time linear in the paths",
    { timeout: 60_000 },
    async () => {
      const deep = Array(1000).fill("d").join("/");
      const empty = `sha256:${createHash("sha256").update("").digest("hex")}`;
      const files = Array.from({ length: 1000 }, (_, i) => `${deep}/f${i}`);
      const pack = tar.pack();
      const items = files.map((p) => ({ type: "file", path: p, digest: empty, size: 0, mode: 0o644 }));
      pack.entry(
        { name: ".pkg/manifest.json" },
        JSON.stringify({ name: "evil", version: "1.0.0", attributes: {}, requires: [], licenses: [], items }),
      );
      for (const f of files) pack.entry({ name: f, mode: 0o644 }, "");
      pack.finalize();
      const chunks: Buffer[] = [];
      for await (const c of pack) chunks.push(c as Buffer);
      const archive = Buffer.concat(chunks);
      const url = await depot({ evil: [{ version: "1.0.0", requires: [] }] }, archive);
      const target = path.join(tmp.dir, "t");
      const result = await createDepotClient({ baseUrl: url }).install("evil", target);
      expect(result.packages.map((p) => p.action)).toEqual(["installed"]);
      expect((await readdir(path.join(target, "evil", deep))).length).toBe(1000);
    },
  );
});
