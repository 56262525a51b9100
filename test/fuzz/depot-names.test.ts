/**
 * Property tests of the depot's small parsers (issue 9, fuzzing): package names,
 * versions, ranges, `<pkg_name>` segments, `Pkg-Path`, `Content-Digest`, and link
 * resolution. Each parser either returns a value that satisfies its documented rule (and
 * parses to itself again) or throws a RunnerDepotError with its documented code — never
 * anything else. Link resolution is checked against the kernel: the random package tree
 * is made on disk, with decoy directories outside it, and every link the resolver
 * accepts resolves (realpath) inside the package, or not at all.
 */
import { mkdir, mkdtemp, realpath, rm, stat, symlink, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import fc from "fast-check";
import semver from "semver";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseHttpDigest } from "../../src/depot/package/digest.js";
import { belowOf, resolveLink, treeOf } from "../../src/depot/package/links.js";
import {
  decodeSegment,
  parsePackageName,
  parsePackageRef,
  parseRange,
  parseVersion,
} from "../../src/depot/package/names.js";
import { CONTROL_RE, MAX_PATH_BYTES, parseItemPath, parseLinkTarget } from "../../src/depot/package/paths.js";
import { RunnerDepotError } from "../../src/errors.js";
import { fuzzParams, fuzzTimeout } from "./settings.js";

/** Runs `fn`; returns its value, or the code of the RunnerDepotError it threw (anything else fails). */
function outcome<T>(fn: () => T): { ok: true; value: T } | { ok: false; code: string } {
  try {
    return { ok: true, value: fn() };
  } catch (error) {
    if (!(error instanceof RunnerDepotError)) throw error;
    return { ok: false, code: error.code };
  }
}

const anyText = fc.oneof(
  fc.string({ maxLength: 80 }),
  fc.string({ unit: "binary", maxLength: 40 }),
  fc.stringMatching(/^[A-Za-z0-9._@%+-]{0,70}$/),
  fc.constantFrom(
    "",
    "a",
    "A-b.c_d",
    "-x",
    ".x",
    "a".repeat(64),
    "a".repeat(65),
    "constructor",
    "__proto__",
    "1.0.0",
    "v1.0.0",
    "=1.0.0",
    "01.0.0",
    "1.0.0-rc.1+b",
    "^1",
    ">=1 <2 || 3.x",
    "*",
    "%40",
    "x%401.0.0",
  ),
);

describe("names, versions, ranges and segments", () => {
  it("parsePackageName: a lower-case name by the rule, or NAME_INVALID", () => {
    for (const params of fuzzParams("package names")) {
      fc.assert(
        fc.property(anyText, (raw) => {
          const r = outcome(() => parsePackageName(raw));
          if (!r.ok) {
            expect(r.code).toBe("NAME_INVALID");
            return;
          }
          expect(r.value).toMatch(/^[a-z0-9][a-z0-9._-]{0,63}$/);
          expect(r.value).toBe(raw.toLowerCase());
          expect(parsePackageName(r.value)).toBe(r.value);
        }),
        params,
      );
    }
  });

  it("parseVersion: canonical SemVer that parses to itself, or VERSION_INVALID", () => {
    const semverish = fc
      .tuple(
        fc.nat(1000),
        fc.nat(1000),
        fc.nat(1000),
        fc.option(fc.stringMatching(/^[0-9A-Za-z-]{1,8}(\.[0-9A-Za-z-]{1,8}){0,2}$/)),
        fc.option(fc.stringMatching(/^[0-9A-Za-z-]{1,8}$/)),
      )
      .map(([a, b, c, pre, build]) => `${a}.${b}.${c}${pre ? `-${pre}` : ""}${build ? `+${build}` : ""}`);
    for (const params of fuzzParams("versions")) {
      fc.assert(
        fc.property(fc.oneof(anyText, semverish), (raw) => {
          const r = outcome(() => parseVersion(raw));
          if (!r.ok) {
            expect(r.code).toBe("VERSION_INVALID");
            return;
          }
          expect(semver.valid(r.value)).toBe(r.value);
          expect(r.value.includes("+")).toBe(false);
          expect(parseVersion(r.value)).toBe(r.value);
          expect(raw.length).toBeLessThanOrEqual(128);
        }),
        params,
      );
    }
  });

  it("parseRange: a range semver accepts (at most 256 characters), or RANGE_INVALID", () => {
    for (const params of fuzzParams("ranges")) {
      fc.assert(
        fc.property(fc.oneof(anyText, fc.stringMatching(/^[0-9x*^~<>=|. \t\n-]{0,40}$/)), (raw) => {
          const r = outcome(() => parseRange(raw));
          if (!r.ok) {
            expect(r.code).toBe("RANGE_INVALID");
            return;
          }
          expect(semver.validRange(r.value)).not.toBeNull();
          expect(/[\u0000-\u001f\u007f-\u009f]/.test(r.value)).toBe(false);
          expect(r.value.length).toBeLessThanOrEqual(256);
        }),
        params,
      );
    }
  });

  it("parsePackageRef and decodeSegment: only their documented codes", () => {
    for (const params of fuzzParams("package refs")) {
      fc.assert(
        fc.property(anyText, (raw) => {
          const segment = outcome(() => decodeSegment(raw));
          if (!segment.ok) expect(segment.code).toBe("BAD_REQUEST");
          const r = outcome(() => parsePackageRef(raw));
          if (!r.ok) {
            expect(["BAD_REQUEST", "NAME_INVALID", "VERSION_INVALID"]).toContain(r.code);
            return;
          }
          expect(parsePackageName(r.value.name)).toBe(r.value.name);
          if (r.value.version !== undefined) expect(parseVersion(r.value.version)).toBe(r.value.version);
        }),
        params,
      );
    }
  });

  it("Content-Digest: undefined, one store digest, or HEADER_INVALID", () => {
    const b64 = fc.uint8Array({ minLength: 0, maxLength: 40 }).map((b) => Buffer.from(b).toString("base64"));
    const member = fc.oneof(
      b64.map((v) => `sha-256=:${v}:`),
      fc.constantFrom(
        "sha-512=:AAAA:",
        "sha-256",
        "sha-256=",
        "SHA-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:",
        "x",
      ),
      fc.string({ maxLength: 20 }),
    );
    for (const params of fuzzParams("content digests")) {
      fc.assert(
        fc.property(fc.array(member, { maxLength: 4 }), (members) => {
          const r = outcome(() => parseHttpDigest(members.join(", ")));
          if (!r.ok) {
            expect(r.code).toBe("HEADER_INVALID");
            return;
          }
          if (r.value !== undefined) expect(r.value).toMatch(/^sha256:[0-9a-f]{64}$/);
        }),
        params,
      );
    }
  });
});

const seg = fc.oneof(
  { weight: 6, arbitrary: fc.constantFrom("a", "b", "c", "l", "m") },
  { weight: 3, arbitrary: fc.constant("..") },
  {
    weight: 1,
    arbitrary: fc.constantFrom(".", "", ".pkg", ".PKG", "é", "e\u0301", "a\u0001", "x\u007f", "y\u0085", "\\"),
  },
  { weight: 1, arbitrary: fc.string({ maxLength: 6 }) },
);
const rawPath = fc.array(seg, { minLength: 1, maxLength: 6 }).map((s) => s.join("/"));

describe("Pkg-Path and link targets", () => {
  it("parseItemPath: a normalised relative path with no control character, or PATH_INVALID", () => {
    for (const params of fuzzParams("item paths")) {
      fc.assert(
        fc.property(
          fc.oneof(
            rawPath,
            fc.string({ unit: "binary", maxLength: 60 }),
            fc.constant("/etc/passwd"),
            fc.constant("a/".repeat(2100)),
          ),
          (raw) => {
            const r = outcome(() => parseItemPath(raw));
            if (!r.ok) {
              expect(r.code).toBe("PATH_INVALID");
              return;
            }
            const p = r.value;
            expect(p).toBe(p.normalize("NFC"));
            expect(CONTROL_RE.test(p)).toBe(false);
            expect(p.startsWith("/") || p.includes("\\") || p.includes("\0")).toBe(false);
            expect(p.split("/").every((s) => s !== "" && s !== "." && s !== "..")).toBe(true);
            expect(p.split("/")[0]!.toLowerCase()).not.toBe(".pkg");
            expect(Buffer.byteLength(p)).toBeLessThanOrEqual(MAX_PATH_BYTES);
            expect(parseItemPath(p)).toBe(p);
          },
        ),
        params,
      );
    }
  });

  it("parseLinkTarget: relative, without control characters, lexically inside the root, or PATH_INVALID", () => {
    for (const params of fuzzParams("link targets")) {
      fc.assert(
        fc.property(
          fc.array(fc.constantFrom("a", "b", "c"), { minLength: 1, maxLength: 4 }),
          rawPath,
          (link, target) => {
            const linkPath = link.join("/");
            const r = outcome(() => parseLinkTarget(linkPath, target));
            if (!r.ok) {
              expect(r.code).toBe("PATH_INVALID");
              return;
            }
            expect(CONTROL_RE.test(r.value)).toBe(false);
            // Lexically: never above the root.
            let depth = link.length - 1;
            for (const s of r.value.split("/")) {
              depth += s === ".." ? -1 : 1;
              expect(depth).toBeGreaterThanOrEqual(0);
            }
          },
        ),
        params,
      );
    }
  });
});

describe("link resolution against the kernel", () => {
  let work: string;
  let n = 0;
  beforeAll(async () => {
    // tmpfs when there is one: thousands of small trees, made and removed.
    const base = await stat("/dev/shm").then(
      (st) => (st.isDirectory() ? "/dev/shm" : os.tmpdir()),
      () => os.tmpdir(),
    );
    work = await mkdtemp(path.join(base, "fuzz-links-"));
    // Decoys outside every package (each sits at <work>/x/x/<n>), so a link that escapes
    // usually resolves to something real.
    for (const d of ["a/b/c", "b/a", "c", "l/m"]) await mkdir(path.join(work, "x", d), { recursive: true });
    for (const d of ["a/b", "c/a", "m"]) await mkdir(path.join(work, d), { recursive: true });
  });
  afterAll(() => rm(work, { recursive: true, force: true }));

  const name = fc.constantFrom("a", "b", "c", "l", "m");
  const relPath = fc.array(name, { minLength: 1, maxLength: 3 }).map((s) => s.join("/"));
  const target = fc
    .array(fc.oneof({ weight: 3, arbitrary: name }, { weight: 2, arbitrary: fc.constant("..") }), {
      minLength: 1,
      maxLength: 7,
    })
    .map((s) => s.join("/"));
  const treeArb = fc.uniqueArray(
    fc.oneof(
      fc.record({ type: fc.constant("dir" as const), path: relPath }),
      fc.record({ type: fc.constant("file" as const), path: relPath }),
      fc.record({ type: fc.constant("link" as const), path: relPath, target }),
    ),
    { maxLength: 8, selector: (i) => i.path },
  );

  it(
    "every link the resolver accepts resolves inside the package or not at all",
    async () => {
      for (const params of fuzzParams("link resolution")) {
        await fc.assert(
          fc.asyncProperty(treeArb, async (items) => {
            // A tree the server would hold: nothing below a file or a link.
            const byPath = new Map(items.map((i) => [i.path, i]));
            const valid = items.filter(
              (i) =>
                !i.path
                  .split("/")
                  .slice(0, -1)
                  .some(
                    (_, k, all) =>
                      byPath.get(all.slice(0, k + 1).join("/"))?.type !== undefined &&
                      byPath.get(all.slice(0, k + 1).join("/"))!.type !== "dir",
                  ),
            );
            fc.pre(valid.some((i) => i.type === "link"));
            const root = path.join(work, "x", "x", String(n++));
            await mkdir(root, { recursive: true });
            const lookup = treeOf(valid);
            // Half the cases prune lookups below directories that hold no item, as the server does.
            const below = n % 2 === 0 ? belowOf(valid) : undefined;
            const accepted: string[] = [];
            for (const item of valid) {
              const full = path.join(root, item.path);
              await mkdir(path.dirname(full), { recursive: true });
              if (item.type === "dir") await mkdir(full, { recursive: true });
              else if (item.type === "file") await writeFile(full, "x");
              else await symlink(item.target, full);
            }
            for (const item of valid) {
              if (item.type !== "link") continue;
              const r = await resolveLink(item.path, item.target, lookup, below).then(
                () => true,
                (error: unknown) => {
                  expect(error).toBeInstanceOf(RunnerDepotError);
                  expect((error as RunnerDepotError).code).toBe("PATH_INVALID");
                  return false;
                },
              );
              if (r) accepted.push(item.path);
            }
            const realRoot = await realpath(root);
            for (const link of accepted) {
              const resolved = await realpath(path.join(root, link)).catch(() => null);
              if (resolved !== null)
                expect(resolved === realRoot || resolved.startsWith(`${realRoot}/`), `${link} → ${resolved}`).toBe(
                  true,
                );
            }
            await rm(root, { recursive: true, force: true });
          }),
          params,
        );
      }
    },
    fuzzTimeout(300_000),
  );
});
