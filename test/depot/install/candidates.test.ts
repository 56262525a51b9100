/** The resolver's windowed candidates (depot/install/candidates.ts) against the plain filter, satisfyingVersions. */
import fc from "fast-check";
import semver from "semver";
import { describe, expect, it } from "vitest";
import { candidates, indexVersions } from "../../../src/depot/install/candidates.js";
import { satisfyingVersions } from "../../../src/depot/install/resolve.js";

const part = fc.integer({ min: 0, max: 4 });
const pre = fc.constantFrom("", "-alpha", "-alpha.1", "-beta", "-0", "-rc.2");
const build = fc.constantFrom("", "", "+b1", "+b2");
const version = fc.tuple(part, part, part, pre, build).map(([a, b, c, p, m]) => `${a}.${b}.${c}${p}${m}`);
const op = fc.constantFrom("", "^", "~", ">=", ">", "<", "<=", "=");
const simple = fc.oneof(
  fc.tuple(op, version).map(([o, v]) => `${o}${v.replace(/\+.*/, "")}`),
  fc.tuple(part, part).map(([a, b]) => `${a}.${b}.x`),
  fc.constantFrom("*", "", "1", "<0.0.0-0", "x"),
  fc.tuple(version, version).map(([a, b]) => `${a.replace(/\+.*/, "")} - ${b.replace(/\+.*/, "")}`),
);
const conj = fc.array(simple, { minLength: 1, maxLength: 2 }).map((xs) => xs.join(" "));
// The resolver sees only ranges semver accepts (resolve.ts checks every requirement's).
const range = fc
  .array(conj, { minLength: 1, maxLength: 3 })
  .map((xs) => xs.join(" || "))
  .filter((r) => semver.validRange(r) !== null);

describe("candidates", () => {
  it("yields exactly satisfyingVersions, in the same order, for any versions and ranges", () => {
    fc.assert(
      fc.property(
        fc.array(fc.oneof(version, fc.constantFrom("junk", "1.0", "v1.2.3")), { maxLength: 30 }),
        fc.array(range, { minLength: 1, maxLength: 3 }),
        (versions, ranges) => {
          expect([...candidates(indexVersions(versions), ranges)]).toEqual(satisfyingVersions(versions, ranges));
        },
      ),
      { numRuns: 1000 },
    );
  });
});
