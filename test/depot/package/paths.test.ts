/**
 * Issue 30 item 9's path rules: bidirectional-text controls and invisible characters are
 * refused at publish (over a real socket) and by the installer, and two paths equal but for
 * case are refused at commit, since a case-insensitive filesystem would write one place.
 */
import { readdir } from "node:fs/promises";
import path from "node:path";
import fc from "fast-check";
import tar from "tar-stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMemoryStore } from "../../../src/adapters/memory/store.js";
import { extractPackage } from "../../../src/depot/install/extract.js";
import { caseCollisions, parseItemPath } from "../../../src/depot/package/paths.js";
import { RunnerDepotError } from "../../../src/errors.js";
import { failure } from "../../fixtures/errors.js";
import { add, openTransaction, publish, startDepot, tempDir, type LiveDepot } from "../../fixtures/depot.js";

const INVISIBLE = [
  "\u202e",
  "\u202a",
  "\u202b",
  "\u202c",
  "\u202d",
  "\u2066",
  "\u2067",
  "\u2068",
  "\u2069",
  "\u200e",
  "\u200f",
  "\u061c",
  "\u200b",
  "\u200c",
  "\u200d",
  "\u2060",
  "\ufeff",
  "\u2028",
  "\u2029",
];

describe("bidi and invisible characters in paths (issue 30 item 9)", () => {
  let depot: LiveDepot;
  beforeAll(async () => {
    depot = await startDepot(createMemoryStore());
  });
  afterAll(() => depot.close());

  it("refuses `a\\u202etxt.exe` and each invisible character at POST /add with PATH_INVALID", async () => {
    const id = await openTransaction(depot.url, "bidi@1.0.0");
    for (const char of INVISIBLE) {
      const response = await add(depot.url, id, { type: "file", path: `a${char}txt.exe`, body: "x" });
      const body = (await response.json()) as { code: string };
      expect([JSON.stringify(char), response.status, body.code]).toEqual([JSON.stringify(char), 400, "PATH_INVALID"]);
    }
    const link = await add(depot.url, id, { type: "link", path: "l", target: "a\u202etxt.exe" });
    expect(link.status).toBe(400);
    expect((await add(depot.url, id, { type: "file", path: "plain-ü.txt", body: "x" })).status).toBe(201);
  });

  it("the installer refuses an archive with such a path before writing anything", async () => {
    const tmp = await tempDir("depot-bidi-");
    try {
      const items = [{ type: "dir" as const, path: "a\u202etxt.exe", mode: "0755" }];
      const pack = tar.pack();
      pack.entry(
        { name: ".pkg/manifest.json", mode: 0o644 },
        JSON.stringify({ name: "evil", version: "1.0.0", attributes: {}, requires: [], licenses: [], items }),
      );
      pack.entry({ name: "a\u202etxt.exe/", type: "directory", mode: 0o755 });
      pack.finalize();
      const chunks: Buffer[] = [];
      for await (const chunk of pack) chunks.push(chunk as Buffer);
      const target = path.join(tmp.dir, "x");
      const error = await failure(extractPackage([Buffer.concat(chunks)], target));
      expect(error.code).toBe("PATH_INVALID");
      expect(await readdir(target).catch(() => [])).toEqual([]);
    } finally {
      await tmp.cleanup();
    }
  });

  it("property: a valid path with any of those characters inserted anywhere is refused", () => {
    const segment = fc.stringMatching(/^[A-Za-z0-9._-]{1,12}$/).filter((s) => s !== "." && s !== ".." && s !== ".pkg");
    fc.assert(
      fc.property(
        fc.array(segment, { minLength: 1, maxLength: 4 }),
        fc.constantFrom(...INVISIBLE),
        fc.nat(),
        (segments, char, at) => {
          const valid = segments.join("/");
          expect(parseItemPath(valid)).toBe(valid);
          const i = at % (valid.length + 1);
          const poisoned = valid.slice(0, i) + char + valid.slice(i);
          expect(() => parseItemPath(poisoned)).toThrow(RunnerDepotError);
        },
      ),
      { numRuns: 300, seed: 30 },
    );
  });
});

describe("paths equal but for case (issue 30 item 9)", () => {
  let depot: LiveDepot;
  beforeAll(async () => {
    depot = await startDepot(createMemoryStore());
  });
  afterAll(() => depot.close());

  it("refuses README with readme, and Docs/a with docs/b, at commit (422 COMMIT_INVALID, PATH_INVALID problems)", async () => {
    for (const [a, b] of [
      ["README", "readme"],
      ["Docs/a", "docs/b"],
    ] as const) {
      const response = await publish(depot.url, `case-${a.length}@1.0.0`, [
        { type: "file", path: a, body: "one" },
        { type: "file", path: b, body: "two" },
      ]);
      const body = (await response.json()) as { code: string; problems: Array<{ code: string; detail: string }> };
      expect([response.status, body.code]).toEqual([422, "COMMIT_INVALID"]);
      expect(body.problems).toEqual([
        expect.objectContaining({ code: "PATH_INVALID", detail: expect.stringMatching(/differ only in case/) }),
      ]);
    }
    expect(
      (
        await publish(depot.url, "case-ok@1.0.0", [
          { type: "file", path: "README", body: "1" },
          { type: "file", path: "README.md", body: "2" },
        ])
      ).status,
    ).toBe(201);
  });

  it("caseCollisions reports each pair once, with ancestors", () => {
    expect(caseCollisions(["a/B/c", "a/b/d", "a/b/e", "x"])).toEqual([["a/B", "a/b"]]);
    expect(caseCollisions(["Makefile", "makefile", "MAKEFILE"])).toEqual([
      ["Makefile", "makefile"],
      ["Makefile", "MAKEFILE"],
    ]);
  });
});
